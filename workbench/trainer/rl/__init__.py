"""The RL step every run shares: `python -m workbench.trainer.rl.trainer`.

`trainer` loads the frozen base, admits runs to adapter slots and runs the update loop;
`packer` turns each ready run's rollout batch into packed micro-batches; `loss` computes
every run's policy loss (its kind from `workbench.trainer.losses`), KL term and
aggregation over one packed micro-batch; `step_stats` is what one update says about each
run (loss, importance ratios, gradient norm).
"""
