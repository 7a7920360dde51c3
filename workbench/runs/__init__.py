"""Run bookkeeping shared by every trainer rank: slots, progress, configs, hooks."""

from workbench.runs.manager import (
    LoRAModule,
    MultiRunManager,
    Progress,
    get_multi_run_manager,
    setup_multi_run_manager,
)

__all__ = [
    "LoRAModule",
    "MultiRunManager",
    "Progress",
    "get_multi_run_manager",
    "setup_multi_run_manager",
]
