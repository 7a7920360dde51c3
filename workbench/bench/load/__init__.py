"""`workbench bench load`: the whole system under a stream of runs coming and going.

- `churn`: the recipe (the shipped one, 16 short runs on 4 slots) and the stream: every few
  seconds one run evicted and runs added back up to 16, through the supervisor.
- `background`: the churn and the watch on the slots, in a child process, away from the TUI.
- `checks`: what must hold afterwards, as pure reads of the experiment's files.
- `keys`: the TUI attached to the experiment, keys pressed and key-to-screen latency timed.
- `runner`: one benchmark run from `up` to `down`, the JSON and the table.
- `stalls`: where a slow key's or poll's time went, in the TUI's own process.
"""
