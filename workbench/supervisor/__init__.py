"""Spawning, watching and restarting an experiment's processes; control channel; state.

- `process`: one supervised child (own session, log file, group stop).
- `policy`: restart on failure with backoff and a maximum.
- `plan`: the recipe turned into processes (inference, trainer, orchestrators).
- `discovery`: which runs get an orchestrator; watchdog on the experiment directory.
- `control`: the Unix-socket control channel.
- `daemon`: the supervisor loop and the daemon process (`python -m workbench.supervisor`).
- `launch`: start, stop and follow a supervisor from the CLI.
- `client`: `SupervisorClient` for the CLI and the TUI.

Nothing is imported here, so `from workbench.supervisor.client import SupervisorClient`
stays light.
"""
