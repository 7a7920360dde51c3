"""Textual's footer, without the keys it no longer shows kept alive.

Textual's `Footer` (8.2) makes each of its keys with `data_bind(compact=Footer.compact)`,
which adds the key to the footer's watchers of `compact`; a watcher whose node has closed
is dropped only when `compact` changes, which it never does here. The footer makes its
keys again whenever the screen's bindings change, at every screen switch, so each switch
kept a footer's worth of dead keys (some 2,200 objects) for the TUI's whole life. This
footer drops the watchers of closed keys once it has made its keys again.
"""

from __future__ import annotations

from textual.widgets import Footer as TextualFooter

# Where Textual's reactive machinery keeps an object's watchers, by attribute name.
_WATCHERS = "__watchers"


class Footer(TextualFooter):
    async def recompose(self) -> None:
        await super().recompose()
        watchers = getattr(self, _WATCHERS, {}).get("compact")
        if watchers:
            # `_closing` is what Textual's own pruning reads; a Textual without it keeps all.
            watchers[:] = [
                (node, callback)
                for node, callback in watchers
                if not getattr(node, "_closing", False)
            ]
