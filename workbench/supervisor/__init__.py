"""Spawning, watching and restarting an experiment's processes; control channel; state.

- `lifecycle`: the states of a supervised process and the table of events that move it.
- `process`: one supervised child (own session, log file, group stop).
- `policy`: restart on failure with backoff and a maximum.
- `plan`: the recipe turned into processes (inference, trainer, orchestrators).
- `discovery`: which runs get an orchestrator; watchdog on the experiment directory.
- `control_socket`: the Unix-socket control channel.
- `daemon`: the supervisor loop and the daemon process (`python -m workbench.supervisor`).
- `launch`: start and stop a supervisor from outside (`workbench up` is `workbench.up`).
- `client`: `SupervisorClient` for the CLI and the TUI.

Nothing is imported here, so `from workbench.supervisor.client import SupervisorClient`
stays light.
"""
