"""Widgets of the TUI, one per area: the runs and processes tables, the log pane, curves."""
