"""Screens of the TUI: the main screen (`main`), a run's detail (`run_detail`), its
curves (`curves`) and samples (`samples`), experiments compared (`compare`), the
`leaderboard`, the `alerts` list, the `timeline` of each process's last minute, `help`, and
the dialogs (`add_run`, `evict`, `confirm`)."""
