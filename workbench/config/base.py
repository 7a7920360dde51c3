"""What every section builds on: `StrictModel`, `[experiment]`, `[model]`, LoRA, run ids."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from workbench.files import layout

# Attention and MLP projections of the Llama, Qwen2/2.5/3 and Mistral families.
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class StrictModel(BaseModel):
    """Unknown keys are errors: a typo must not silently fall back to a default. No float
    setting takes inf or nan (TOML spells them `inf`, `nan`): a learning rate, a clip norm or
    a timeout of either is a mistake that would surface only once the runs are going."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class LoraConfig(StrictModel):
    rank: int = Field(
        8,
        ge=1,
        description="LoRA rank r; in `[trainer]` the rank of every adapter slot, the most a "
        "run may ask for",
    )
    alpha: float = Field(16.0, gt=0, description="LoRA alpha; the update is scaled by alpha / rank")


def lora_rank_problem(run_rank: int | None, trainer_rank: int) -> str | None:
    """Why a run's `lora.rank` cannot have a trainer slot of `trainer_rank`, or None."""
    if run_rank is None or run_rank <= trainer_rank:
        return None
    return (
        f"rank {run_rank} is larger than the trainer's adapter slots ([trainer] lora.rank = "
        f"{trainer_rank}); raise that or ask for at most {trainer_rank}"
    )


def control_characters(text: str) -> list[str]:
    """The control characters and line breaks in `text` (newline, tab, escape, ...), as
    repr()s: in a generated script or a log line, a line break starts a new line (of bash,
    of an `#SBATCH` option) and an escape rewrites the terminal."""
    found = {c for c in text if unicodedata.category(c) in ("Cc", "Zl", "Zp")}
    return [repr(c) for c in sorted(found)]


class ExperimentSection(StrictModel):
    name: str = Field("experiment", description="the experiment's name")
    output_dir: Path | None = Field(
        None, description="the experiment directory; default: `outputs/<name>`"
    )

    @field_validator("name", "output_dir")
    @classmethod
    def _one_printable_line(cls, value: str | Path | None) -> str | Path | None:
        # The name and the directory go into the Slurm job's script and into logs.
        bad = control_characters(str(value)) if value is not None else []
        if bad:
            raise ValueError(
                f"{str(value)!r} contains control characters ({' '.join(bad)}): write it "
                "on one line, without tabs or escapes"
            )
        return value


class ModelSection(StrictModel):
    base: str = Field(
        description="`builtin:tiny-reverse` (or `builtin:tiny-reverse-chat`), a local model "
        "directory or a hub id"
    )


def normalize_run_id(raw: str) -> str:
    """`lr1e-3` -> `run_lr1e-3`; an id that already starts with `run_` is kept."""
    return raw if raw.startswith(layout.RUN_PREFIX) else layout.RUN_PREFIX + raw


# A run id names its directory (255 bytes at most on Linux) and shows in tables.
MAX_RUN_ID_CHARS = 128


def check_run_id(raw: str) -> str | None:
    """None if `raw` is a usable run id, else what is wrong with it."""
    if not raw:
        return "run id is empty"
    if len(raw) > MAX_RUN_ID_CHARS:
        return (
            f"run id {raw[:20]!r}... is {len(raw)} characters long; at most "
            f"{MAX_RUN_ID_CHARS} (it names a directory)"
        )
    if not layout.RUN_ID_PATTERN.match(raw):
        bad = sorted({c for c in raw if not re.match(r"[A-Za-z0-9_-]", c)})
        return (
            f"run id {raw!r} may contain only letters, digits, '_' and '-' "
            f"(found {' '.join(repr(c) for c in bad)})"
        )
    return None
