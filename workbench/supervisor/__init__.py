"""Spawning, watching and restarting an experiment's processes; control channel; state.

- `lifecycle`: the states of a supervised process and the table of events that move it.
- `process`: one supervised child (own session, log file, group stop).
- `policy`: restart on failure with backoff and a maximum.
- `plan`: the recipe turned into processes (inference, trainer, orchestrators).
- `startup`: what a starting experiment is doing (the startup phase in state.json).
- `discovery`: which runs get an orchestrator; watchdog on the experiment directory.
- `control_socket`: the Unix-socket control channel.
- `paths`: the supervisor's own files under `supervisor/` and Unix socket addresses.
- `daemon`: the supervisor loop and the daemon process (`python -m workbench.supervisor`).
- `launch`: start and stop a supervisor from outside (`workbench up` is `workbench.up`).
- `client`: `SupervisorClient` for the CLI and the TUI.
- `join`: another node's share of the trainer, joined to an experiment started elsewhere.
- `preflight`: what can be found wrong with a recipe or a run to add before anything starts.
- `devices`: which GPUs run vLLM and which the trainer, checked against the machine.
- `slots`: how many runs fit at once (`max_concurrent_runs = "auto"`), from memory.
- `fork`: a new run from a checkpoint another run keeps (`workbench runs fork`, PBT).
- `tinker_service`: the Tinker-compatible service as a process of the plan (`workbench serve`).
- `__main__`: `python -m workbench.supervisor --experiment DIR`, the daemon's entry.

Processes are read from /proc through `workbench.system.procfs`. The stand-in plan that tests and
benchmarks run in place of the real children is `workbench.testing.standins`.

Nothing is imported here, so `from workbench.supervisor.client import SupervisorClient`
stays light.
"""
