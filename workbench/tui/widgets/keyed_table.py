"""A DataTable whose rows are replaced by key, touching only the cells that changed.

Both tables of the main screen are refreshed every poll with the whole state. Rewriting
every cell would redraw the table every second; here an unchanged cell is left alone, so
an idle experiment costs (almost) no rendering. Columns can be hidden when the terminal
is narrow; the rows are re-added from what the table last showed.

Column widths are fixed rather than left to DataTable's auto-width: the name column is
sized here to the longest key, but never so wide that the other columns leave the screen
(a long name is shortened in the middle, where sweep names differ least), which also keeps
the layout from jumping as cells change. One column may `fill` the room the others leave.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.widgets import DataTable
from textual.widgets.data_table import RowDoesNotExist

Cell = str | Text
# Bounds of the name column; longer names are shortened (the detail screen has them whole).
MIN_NAME_WIDTH = 10
MAX_NAME_WIDTH = 40


@dataclass(frozen=True)
class ColumnSpec:
    key: str
    label: str
    width: int | None = None  # None: as wide as the widest row key (the name column)
    optional: bool = False  # dropped first when the terminal is narrow
    fill: bool = False  # as wide as the room left, and at least `width`


class KeyedTable(DataTable[Cell]):
    """Rows keyed by a name (run id, process name); `show_rows` applies a full state."""

    COLUMNS: Sequence[ColumnSpec] = ()

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(
            id=id, classes=classes, cursor_type="row", zebra_stripes=False, cell_padding=1
        )
        self._rows: dict[str, dict[str, Cell]] = {}
        # Each row's object as last shown and the cells made of it (`show_objects`).
        self._made: dict[str, tuple[Any, dict[str, Cell]]] = {}
        self._compact = False
        self._name_width = 0
        self._fill_width = 0

    def on_mount(self) -> None:
        self._add_columns()

    def on_resize(self) -> None:
        self._fit_name_column(self._rows)

    def _spare_cells(self) -> int:
        """Cells left for the name column once the fixed columns (a fill column at its
        least) and the scrollbar are in."""
        padding = 2 * self.cell_padding
        fixed = sum(max(c.width, len(c.label)) + padding for c in self.visible_columns if c.width)
        return self.size.width - fixed - padding - 1

    def _name_column_room(self) -> int:
        return max(MIN_NAME_WIDTH, min(MAX_NAME_WIDTH, self._spare_cells()))

    def _fit_name_column(self, rows: Mapping[str, Mapping[str, Cell]]) -> bool:
        """Resize the name column to the longest name that fits, and the fill column to
        the room left; True if they changed and the table was rebuilt."""
        longest = max((len(key) for key in rows), default=0)
        width = min(longest, self._name_column_room())
        fill_width = self._fill_column_room(width)
        if (width, fill_width) == (self._name_width, self._fill_width):
            return False
        self._name_width, self._fill_width = width, fill_width
        self._rows = {key: dict(cells) for key, cells in rows.items()}
        self._rebuild()
        return True

    def _fill_column_room(self, name_width: int) -> int:
        """The fill column's least width and what the name column leaves of the spare
        cells; 0 without a fill column."""
        fill = next((c for c in self.visible_columns if c.fill), None)
        if fill is None:
            return 0
        return max(fill.width or 0, len(fill.label)) + self._spare_cells() - name_width

    @property
    def visible_columns(self) -> list[ColumnSpec]:
        return [c for c in self.COLUMNS if not (self._compact and c.optional)]

    def _add_columns(self) -> None:
        for column in self.visible_columns:
            width = column.width if column.width is not None else self._name_width
            if column.fill:
                width = max(width, self._fill_width)
            self.add_column(column.label, key=column.key, width=max(width, len(column.label)))

    def _rebuild(self) -> None:
        """Columns and rows again from `_rows` (rare: a column appears or resizes)."""
        selected = self.selected_key
        self.clear(columns=True)
        self._add_columns()
        for key, cells in self._rows.items():
            self.add_row(*self._ordered(cells), key=key)
        if selected is not None:
            self.select_key(selected)

    def set_compact(self, compact: bool) -> None:
        """Hide (or show again) the optional columns; rows and cursor are kept."""
        before = self.visible_columns
        self._compact = compact
        if self.visible_columns != before:
            self._rebuild()

    @property
    def selected_key(self) -> str | None:
        if not self.row_count:
            return None
        row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        return row_key.value

    def select_key(self, key: str) -> bool:
        try:
            index = self.get_row_index(key)
        except RowDoesNotExist:
            return False
        self.move_cursor(row=index)
        return True

    def show_rows(self, rows: Mapping[str, Mapping[str, Cell]]) -> None:
        """Make the table show exactly `rows`, in their order."""
        if self._fit_name_column(rows):
            return
        for gone in [key for key in self._rows if key not in rows]:
            self.remove_row(gone)
        for key, cells in rows.items():
            previous = self._rows.get(key)
            if previous is None:
                self.add_row(*self._ordered(cells), key=key)
                continue
            for column in self.visible_columns:
                old, new = previous.get(column.key), cells[column.key]
                if old is not new and old != new:  # the same object: the same cell
                    self.update_cell(key, column.key, new)
        self._rows = {key: dict(cells) for key, cells in rows.items()}
        self._keep_order(list(rows))

    def show_objects(
        self,
        objects: Mapping[str, Any],
        still_cells: Callable[[Any], dict[str, Cell]],
        clock_cells: Callable[[Any], dict[str, Cell]],
    ) -> None:
        """`show_rows` for rows made of `objects` (key -> a frozen row object): an object
        that is the very one shown last time keeps the cells `still_cells` made of it (the
        very cell objects, skipped by identity), and only its `clock_cells` (ages,
        uptimes) are made again."""
        made: dict[str, tuple[Any, dict[str, Cell]]] = {}
        rows = {}
        for key, obj in objects.items():
            known = self._made.get(key)
            if known is None or known[0] is not obj:
                known = (obj, still_cells(obj))
            made[key] = known
            rows[key] = {**known[1], **clock_cells(obj)}
        self._made = made
        self.show_rows(rows)

    def forget_made_cells(self) -> None:
        """Make every row's cells again at the next `show_objects` (what they are drawn
        from changed beyond the row objects: a scale shared by the rows)."""
        self._made = {}

    def _keep_order(self, order: list[str]) -> None:
        # New rows are appended at the end, and rows keep their place when the caller's
        # order changes (a ranking); rebuild (rare: only when a row is out of place) so
        # the table follows the caller's order, keeping the cursor on its row.
        if [row.key.value for row in self.ordered_rows] == order:
            return
        selected = self.selected_key
        self.clear()
        for key in order:
            self.add_row(*self._ordered(self._rows[key]), key=key)
        if selected is not None:
            self.select_key(selected)

    def _ordered(self, cells: Mapping[str, Cell]) -> list[Cell]:
        return [
            shorten_middle(str(cells[c.key]), self._name_width) if c.width is None else cells[c.key]
            for c in self.visible_columns
        ]


def shorten_middle(name: str, width: int) -> str:
    """`run_sweep_lr01_seed3` in 14 cells -> `run_swe…_seed3`: both ends stay readable."""
    if len(name) <= width or width < 3:
        return name
    head = (width - 1) // 2
    tail = width - 1 - head
    return f"{name[:head]}…{name[-tail:]}"
