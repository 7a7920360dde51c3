"""Alerts: rules checked by the supervisor as records arrive, one alert per episode.

- `rules.py`: the rules, pure state machines over one run's records (reward collapse, eval
  regression, non-finite loss or gradient norm, KL and importance-ratio spikes), and the
  checks of time (a run that records nothing, a process whose failures come in a burst).
- `watcher.py`: `AlertWatcher`, run by the supervisor's loop: follows every run's
  metrics.jsonl and the processes' exits, appends each new alert to `alerts.jsonl`
  (`workbench.files.alerts`) and hands it to experiment tracking.

The recipe's `[alerts]` (`workbench.config.alerts`) switches them and sets thresholds;
`workbench alerts` and the TUI read the file.
"""

from workbench.alerts.watcher import AlertWatcher

__all__ = ["AlertWatcher"]
