"""Telling whether a file changed without reading it: signatures, and values derived again
only when their file changes (`OnFileChange`).

For readers that ask every second about files that rarely change (a run's orch.toml and
control files, the recipe, the sweep's decisions, metrics.jsonl): a `stat` is all an
unchanged file costs.

A signature is the file's (inode, size, modification time). A modification time is only
as fine as the kernel's clock tick (and a second or two on some file systems), so a file
changed twice within one tick can keep its signature: a value derived from a file whose
signature is that recent is not trusted and is derived again next time (`settled`, as
git treats its "racily clean" index entries).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")
# (inode, size, modification time in ns); None while the file does not exist.
Signature = tuple[int, int, int] | None
# How long after its last change a file's signature is trusted to show the next change.
SETTLE_NS = 2_000_000_000


def signature(path: str | os.PathLike[str]) -> Signature:
    """The file's (or directory's) signature; None when it does not exist."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def settled(signatures: tuple[Signature, ...], now_ns: int, settle_ns: int = SETTLE_NS) -> bool:
    """Whether every one of `signatures` was last changed long enough before `now_ns` that
    a further change would show in it (a file that does not exist is settled)."""
    return all(sig is None or now_ns - sig[2] >= settle_ns for sig in signatures)


class OnFileChange(Generic[T]):
    """A value derived from one file, derived again only when the file changes (its
    inode, size or modification time), appears or goes, or changed too recently to tell."""

    def __init__(self, path: Path, derive: Callable[[], T], settle_ns: int = SETTLE_NS) -> None:
        self.path = path
        self._derive = derive
        self._settle_ns = settle_ns
        # The signature and the value it was derived at, set together in one assignment:
        # a reader in another thread never pairs one file's value with another's signature.
        # The signature is None-wrapped in a 1-tuple while it is not settled yet.
        self._derived: tuple[tuple[Signature] | None, T] | None = None

    def get(self) -> T:
        current = signature(self.path)
        derived = self._derived
        if derived is None or derived[0] != (current,):
            trusted = settled((current,), time.time_ns(), self._settle_ns)
            derived = ((current,) if trusted else None, self._derive())
            self._derived = derived
        return derived[1]
