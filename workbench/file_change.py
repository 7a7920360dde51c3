"""`OnFileChange`: a value derived from one file, derived again only when the file changes.

For readers that ask every second about files that rarely change (a run's orch.toml, the
recipe, the sweep's decisions): a `stat` is all an unchanged file costs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")
# (inode, size, modification time); None while the file does not exist.
Signature = tuple[int, int, int] | None


class OnFileChange(Generic[T]):
    """A value derived from one file, derived again only when the file changes (its
    inode, size or modification time) or appears or goes."""

    def __init__(self, path: Path, derive: Callable[[], T]) -> None:
        self.path = path
        self._derive = derive
        # The signature and the value it was derived at, set together in one assignment:
        # a reader in another thread never pairs one file's value with another's signature.
        self._derived: tuple[Signature, T] | None = None

    def get(self) -> T:
        try:
            stat = os.stat(self.path)
            signature: Signature = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        except OSError:
            signature = None
        derived = self._derived
        if derived is None or derived[0] != signature:
            derived = (signature, self._derive())
            self._derived = derived
        return derived[1]
