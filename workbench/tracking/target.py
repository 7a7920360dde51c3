"""The recipe's `[tracking]` with its defaults resolved: what the supervisor's plan hands on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workbench.recipe import Recipe


@dataclass(frozen=True)
class TrackingTarget:
    backend: str  # "trackio" or "wandb"
    project: str
    experiment: str  # the experiment's name: the group of every tracker run
    dir: Path | None  # None: the library's own default (trackio) or the experiment (wandb)
    mode: str = "offline"  # wandb only
    entity: str | None = None  # wandb only

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> TrackingTarget | None:
        """None when the recipe tracks nothing (`backend = "none"`, the default)."""
        section = recipe.tracking
        if section.backend == "none":
            return None
        return cls(
            backend=section.backend,
            project=section.project or recipe.experiment.name,
            experiment=recipe.experiment.name,
            # Relative to where `workbench up` ran, as output_dir is: the supervisor
            # starts there.
            dir=section.dir.resolve() if section.dir is not None else None,
            mode=section.mode,
            entity=section.entity,
        )

    def tracker_run_name(self, run_id: str) -> str:
        """The run id; prefixed by the experiment when the project is shared with others,
        so that two experiments' `run_a` stay two runs (trackio resumes a run by name)."""
        return run_id if self.project == self.experiment else f"{self.experiment}-{run_id}"
