"""Experiment tracking: every run's metrics.jsonl forwarded to trackio or wandb.

One component does it, in the supervisor: `MetricsForwarder` follows each run's
metrics.jsonl on its own thread and sends every orchestrator, trainer and eval record, with
its step, to one tracker run per workbench run (grouped by experiment, with the run's
orch.toml values as its config). Trainer and orchestrators know nothing of it, and the
libraries are an optional extra (`pip install -e '.[tracking]'`).

- `target.py`: the recipe's `[tracking]` with its defaults resolved (what the plan hands on).
- `backend.py`: what the forwarder needs of a library; `trackio_backend.py` and
  `wandb_backend.py` are the adapters.
- `progress.py`: `tracking/<run_id>.json`, how far each run was forwarded, so a restarted
  supervisor sends nothing twice.
- `forwarder.py`: the follower, and `open_backend`, which picks the adapter. A tracking
  failure is a warning (supervisor log, state.json), never a stopped run.
"""

from workbench.tracking.forwarder import MetricsForwarder, start_forwarding
from workbench.tracking.target import TrackingTarget

__all__ = ["MetricsForwarder", "TrackingTarget", "start_forwarding"]
