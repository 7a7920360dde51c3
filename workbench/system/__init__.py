"""Operating-system helpers, one idea a module: `clock` (UTC timestamps, durations),
`procfs` (processes and memory from /proc), `priority` (batch priorities), `ports`
(free ports, the interface that reaches a host), `lifeline` (a child's tie to its parent),
`signals` (SIGTERM taken as Ctrl-C), `small_machine` (at most two CPUs), `gpus`,
`file_tail`, `file_change` (signatures), `tree_events` (a directory tree's file events,
watchdog), `polling` (waiting for another process), `console` (tables whole when piped) and `cache`
(where workbench keeps what it makes once).

Nothing here knows an experiment; everything else may use it."""
