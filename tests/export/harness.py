"""A run trained by the real trainer on `builtin:tiny-reverse`, and loading adapters the way
a user without workbench would."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import torch

from tests.helpers import iterate_published, make_run, random_batch
from workbench.config import ModelSection, TrainerConfig, TrainerSection
from workbench.files.rollouts import write_rollouts
from workbench.trainer.lora.layer import set_lora_num_tokens
from workbench.trainer.rl.trainer import build_trainer, load_base_model

BASE = "builtin:tiny-reverse"
STEPS = 5
PROBE = [[3, 17, 9, 42, 5, 33, 8, 21]]


@dataclass(frozen=True)
class TrainedRun:
    experiment: Path
    run: Path
    logits: dict[int, torch.Tensor]  # the trainer's logits of PROBE after each step (0: none)


def train_run(experiment: Path) -> TrainedRun:
    """run_a after 5 updates with checkpoints every 2: the trainer keeps broadcasts 3-5 and
    checkpoints 2, 4 and 5 (its last step). Its rank is half the trainer's slots'."""
    run = make_run(
        experiment,
        "run_a",
        f"lr = 0.05\nmax_steps = {STEPS}\ncheckpoint_interval = 2\nlora = {{ rank = 4 }}\n",
    )
    config = TrainerConfig(
        output_dir=experiment,
        model=ModelSection(base=BASE),
        trainer=TrainerSection(max_concurrent_runs=2, seq_len=64),
    )
    model = load_base_model(BASE, torch.float32, torch.device("cpu"))
    trainer = build_trainer(config, model, torch.device("cpu"))
    iterate_published(trainer)
    counts = torch.zeros(trainer.manager.max_runs, dtype=torch.long)
    counts[trainer.manager.id_2_idx["run_a"]] = len(PROBE[0])

    def probe_logits() -> torch.Tensor:
        set_lora_num_tokens(trainer.model, counts)
        with torch.no_grad():
            return trainer.model(input_ids=torch.tensor(PROBE)).logits

    logits = {0: probe_logits()}
    for step in range(STEPS):
        write_rollouts(run, random_batch("run_a", step, 8, seed=step))
        assert iterate_published(trainer) == "trained"
        logits[step + 1] = probe_logits()
    return TrainedRun(experiment, run, logits)


def logits_without_workbench(tmp_path: Path, setup: str) -> torch.Tensor:
    """PROBE's logits from `model`, as the Python code `setup` builds it, in a fresh process
    in which importing workbench fails."""
    out = tmp_path / "logits.pt"
    script = "\n".join(
        [
            "import sys",
            'sys.modules["workbench"] = None',
            "import torch",
            textwrap.dedent(setup),
            "with torch.no_grad():",
            f"    torch.save(model(input_ids=torch.tensor({PROBE})).logits, {str(out)!r})",
        ]
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path)
    return torch.load(out)
