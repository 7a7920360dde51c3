"""Screens of the TUI: the main screen (`main`), a run's detail (`run_detail`), its
curves (`curves`) and samples (`samples`), experiments compared (`compare`), the
`leaderboard`, the `alerts` list, the `timeline` of each process's last minute, runs
`side_by_side` on held-out prompts, the `playground` (a prompt to every adapter), `help`,
and the dialogs (`add_run`, `evict`, `confirm`)."""
