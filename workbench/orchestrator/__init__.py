"""The orchestrator: one process per run that turns its adapter's completions into batches.

`loop` is the per-run loop, `advantages` the GRPO advantages, `state` its checkpoint.
"""
