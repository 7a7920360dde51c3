"""The commands of the `workbench` CLI that have modules of their own, and what every
command shares (`common`). `workbench/cli.py` assembles the app; the work behind each
command lives below the CLI (`workbench.up`, `workbench.trainer.sft.flow`, ...).
"""
