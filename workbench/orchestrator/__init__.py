"""The orchestrator: one process per run that turns its adapter's completions into batches.

- `__main__`: the process (`python -m workbench.orchestrator --run-dir RUN`): checks the
  run's environment, waits for the server, runs the loop;
- `loop`: `Orchestrator`, one step after another: sample, score, write the batch, wait;
- `generation`: asking the server for completions of many prompts at once;
- `episodes`: completions, single- or multi-turn, as the exact tokens the trainer trains on;
- `advantages`: the GRPO advantages of a group;
- `evaluation`: scoring the run's policy versions on held-out prompts while it trains;
- `state`: the orchestrator's own checkpoint (step, data position, RNG).

The orchestrator imports no supervisor module: what it shares with the trainer and the
supervisor is the experiment directory's files (`workbench.files`).
"""
