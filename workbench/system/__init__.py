"""Operating-system helpers: clocks, /proc, process priorities, free ports, a child's
lifeline to its parent, the small-machine check, file tails, file-change signatures and a
directory tree's file events (watchdog, `tree_events`).

Nothing here knows an experiment; everything else may use it."""
