"""The RL step every run shares: `python -m workbench.trainer.rl.trainer`.

`trainer` loads the frozen base, admits runs to adapter slots and runs the update loop;
`packer` turns each ready run's rollout batch into packed micro-batches; `loss` computes
every run's policy loss (its kind from `workbench.trainer.losses`), KL term and
aggregation over one packed micro-batch; `step_stats` is what one update says about each
run (loss, importance ratios, gradient norm); `state` is what the process holds (`Trainer`).
`tinker_work` answers a Tinker client's work items (its datums computed in the same pass
as the native rows, its optim_step), `tinker_packing` lays the datums of a pass in shared
rows where that changes no bit of their results, and `tinker_state` saves and loads.
"""
