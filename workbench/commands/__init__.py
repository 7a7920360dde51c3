"""The commands of the `workbench` CLI that have modules of their own, and what every
command shares (`common`). `workbench/cli.py` assembles the app; the work behind each
command lives below the CLI (`workbench.up`, `workbench.trainer.sft.flow`, ...).

One module per command or family: `status`, `runs` (add, fork, list), `sweep`, `compare`,
`plot`, `ask` (one prompt to every run's adapter), `models` (`model build`, `sft`), `envs`
(`env install`), `slurm`, `web`, `alerts`,
`trace` (the Perfetto timeline) and `serve` (the Tinker-compatible service).
"""
