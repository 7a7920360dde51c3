"""Widgets of the TUI, one per area: the runs and processes tables (`runs_table`,
`processes_table`, both `keyed_table`s), the `leaderboard_table`, the log pane (`log_pane`),
`curves` and the `footer`."""
