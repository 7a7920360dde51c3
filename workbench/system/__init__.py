"""Operating-system helpers: clocks, /proc, process priorities, free ports, a child's
lifeline to its parent, the small-machine check, file tails and file-change signatures.

Nothing here knows an experiment; everything else may use it."""
