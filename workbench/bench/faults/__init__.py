"""`workbench bench faults`: faults injected into a real experiment, and the promises checked.

`experiment.py` drives one experiment through the CLI (`up --headless --detach`, `down`)
and watches its processes; `invariants.py` reads what the experiment left on disk (steps
trained twice, checkpoints loaded, half-written files, processes left behind);
`scenarios.py` holds the faults, one function each; `runner.py` runs them one after the
other from a seed and writes the report; `security.py` checks a running experiment's
files and sockets, reported beside the faults.
"""
