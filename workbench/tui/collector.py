"""Python's cycle collector, kept from pausing the TUI for a tenth of a second at a time.

With a few hundred runs the TUI holds some 300,000 objects: its imports and widgets, and
Textual's caches of rendered lines (`Segment`s, `Strip`s and their caches), which churn with
every redraw. Under Python's default thresholds the collector then walks all of them about
every five seconds, a pause of 50 to 150 ms on a loaded 2-core machine: a key pressed then
waits for it (measured with `bench load`'s key driver on 300 runs; see docs/benchmarks/load.md).

`settle()`, once the first snapshot is on screen, moves every object alive then (imports,
widgets, the reader's state) to the permanent generation (`gc.freeze`), which no
collection walks again, and lets more allocations pass between young collections.

A TUI that grows (a sweep adding runs for hours) makes most of its objects after that, and
a full collection walks them all (1.0 s at 330 runs in `bench load`, which starts the TUI
at 16). So when a full collection ends with more survivors outside the permanent
generation than `REFREEZE_GROWTH` of those in it, they are frozen too. Not after every
full collection: a frozen object that later dies in a cycle is never collected until
`restore()`, and Textual keeps cycles alive for a while and then drops them (restyling a
screen makes a virtual DOM node per component class of each widget, some 60 objects each,
kept until the next restyle). Freezing on growth only, the number of freezes grows with the
logarithm of the TUI's size, so what can be kept that way is bounded, whereas freezing
after every collection would keep some of it at each one, for as long as the TUI runs.
Objects freed by reference counting are freed as before. `restore()`, which the app calls
when it exits, unfreezes everything, so nothing is kept beyond the TUI's life (tests run
many apps in one process).
"""

from __future__ import annotations

import gc

# Allocations between young collections: Python's 700 makes one every few frames of a large
# table; ten thousand costs at most a few ms each and keeps the older generations quiet.
YOUNG_THRESHOLD = 10_000
# A full collection whose survivors outside the permanent generation exceed this share of
# those in it freezes them (see above).
REFREEZE_GROWTH = 0.25


class QuietCollector:
    def __init__(self) -> None:
        self._before: tuple[int, int, int] | None = None

    @property
    def settled(self) -> bool:
        return self._before is not None

    def settle(self) -> None:
        """Freeze what lives now and space the collections out (once; later calls do nothing)."""
        if self._before is not None:
            return
        self._before = gc.get_threshold()
        gc.freeze()
        young, middle, old = self._before
        gc.set_threshold(max(YOUNG_THRESHOLD, young), middle, old)
        gc.callbacks.append(self._after_collection)

    def restore(self) -> None:
        """Python's thresholds as they were, every frozen object collectable again."""
        if self._before is None:
            return
        if self._after_collection in gc.callbacks:
            gc.callbacks.remove(self._after_collection)
        gc.set_threshold(*self._before)
        gc.unfreeze()
        self._before = None

    @staticmethod
    def _after_collection(phase: str, info: dict[str, int]) -> None:
        if phase != "stop" or info["generation"] != 2:
            return
        # The survivors are all in the oldest generation now, no garbage among them.
        if len(gc.get_objects(generation=2)) > REFREEZE_GROWTH * gc.get_freeze_count():
            gc.freeze()
