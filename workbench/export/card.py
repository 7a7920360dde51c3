"""The model card (README.md) of an exported adapter: what it is, how it was trained, how
well it did, and how to load it with peft and vLLM. Front matter as the Hugging Face hub
and peft's own cards have it (`base_model`, `library_name: peft`)."""

from __future__ import annotations

import json
import shlex
import statistics
from pathlib import Path
from typing import Any

from workbench.config import ConfigError, OrchestratorConfig, load_orchestrator_config
from workbench.curves import metric_curve
from workbench.export.selection import Choice
from workbench.files import layout, run_control
from workbench.files.metrics import read_metrics
from workbench.models.resolve import is_builtin
from workbench.sweep.values import flatten_values, show_value
from workbench.trainer.runs.broadcast import read_adapter_info

CARD_FILE = "README.md"
WINDOW = 5  # steps averaged at each end of the reward curve
# vLLM serves LoRA ranks up to 16 by default and accepts only these larger limits.
VLLM_DEFAULT_MAX_LORA_RANK = 16
VLLM_MAX_LORA_RANKS = (32, 64, 128, 256, 320, 512)


def model_card(run: Path, choice: Choice, adapter_dir: Path, output: Path) -> str:
    """README.md for the adapter files in `adapter_dir`, to be found at `output`."""
    adapter = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
    base_path = adapter["base_model_name_or_path"]
    base_name = read_adapter_info(adapter_dir).get("base_model", base_path)
    config = _run_config(run)
    env = config.env if config else "?"
    targets = ", ".join(sorted(adapter["target_modules"]))
    source = choice.adapter.path.relative_to(run)
    sections = [
        f"---\nbase_model: {base_path}\nlibrary_name: peft\n"
        "tags:\n- lora\n- reinforcement-learning\n- workbench\n---",
        f"# {run.name} of {run.parent.name}: its adapter after step {choice.adapter.step}",
        f"A LoRA adapter (rank {adapter['r']}, alpha {show_value(adapter['lora_alpha'])}, on "
        f"{targets}) trained with reinforcement learning on the `{env}` environment by "
        f"workbench. This is {choice.note}, from `{source}`.",
        "## Base model\n\n" + _base_model_text(base_name, base_path),
        "## Training\n\n" + "\n".join(_training_lines(run, config)),
        "## Run config\n\n" + _config_table(config),
        "## Load it\n\n" + _loading_text(base_path, output.resolve(), run.name, adapter["r"]),
    ]
    return "\n\n".join(sections) + "\n"


def _run_config(run: Path) -> OrchestratorConfig | None:
    try:
        return load_orchestrator_config(layout.orch_config_path(run))
    except ConfigError:
        return None


def _base_model_text(name: str, path: str) -> str:
    if not is_builtin(name):
        return f"`{path}`"
    return (
        f"`{name}`, a model workbench builds itself, at `{path}`. On another machine "
        "`workbench model build` builds the same model into the same directory name (the "
        "hash in it covers everything that decides the weights)."
    )


def _training_lines(run: Path, config: OrchestratorConfig | None) -> list[str]:
    trained = max((r["step"] for r in read_metrics(run, "trainer")), default=0)
    max_steps = config.max_steps if config else "?"
    eviction = run_control.read_eviction(run)
    if run_control.is_finished(run):
        state = "finished"
    elif eviction is not None:
        state = f"evicted: {eviction.reason.splitlines()[0]}"
    else:
        state = "not finished when exported"
    lines = [f"- Steps trained: {trained} of {max_steps} ({state})."]
    rewards = _reward_curve(run)
    if rewards:
        lines.append(f"- Training reward (mean over each step's rollouts): {_curve(rewards)}.")
    evals = metric_curve(read_metrics(run, "eval"), "eval_reward_mean")
    if evals:
        held_out = (
            f"{config.eval.num_prompts} held-out prompts, temperature "
            f"{show_value(config.eval.sampling.temperature)}"
            if config
            else "held-out prompts"
        )
        curve = ", ".join(f"{value:.3f} (step {step})" for step, value in evals)
        lines.append(f"- Eval reward ({held_out}; step 0 is the base model): {curve}.")
    else:
        lines.append("- Eval reward: no evals were recorded.")
    return lines


def _reward_curve(run: Path) -> list[tuple[int, float]]:
    """(step, reward_mean) of the batches trained on, by step."""
    by_step: dict[int, float] = {}
    for record in read_metrics(run, "orchestrator"):
        if record.get("written", True) and isinstance(record.get("reward_mean"), int | float):
            by_step[record["step"]] = float(record["reward_mean"])
    return sorted(by_step.items())


def _curve(points: list[tuple[int, float]]) -> str:
    """A reward curve in a sentence: its two ends (averaged over a few steps) and its best."""
    values = [value for _, value in points]
    best_step, best = max(points, key=lambda point: point[1])
    if len(values) > WINDOW:
        ends = (
            f"{statistics.fmean(values[:WINDOW]):.3f} over the first {WINDOW} steps, "
            f"{statistics.fmean(values[-WINDOW:]):.3f} over the last {WINDOW}"
        )
    else:
        ends = f"{values[0]:.3f} at step {points[0][0]}, {values[-1]:.3f} at {points[-1][0]}"
    return f"{ends}; best {best:.3f} at step {best_step} ({len(values)} steps)"


def _config_table(config: OrchestratorConfig | None) -> str:
    if config is None:
        return "The run's control/orch.toml could not be read."
    values: dict[str, Any] = flatten_values(config.model_dump(mode="json"))
    # None is a setting taken from elsewhere: the trainer's LoRA, sampling.max_tokens.
    rows = [
        f"| `{key}` | {'(inherited)' if value is None else show_value(value)} |"
        for key, value in values.items()
    ]
    return "\n".join(["| key | value |", "| --- | --- |", *rows])


def _loading_text(base: str, adapter: Path, name: str, rank: int) -> str:
    """How to load the adapter, as Python and as a shell command to paste: the paths (a
    model directory may be named anything) are a Python string literal in the one and one
    quoted word in the other."""
    limit = next((r for r in VLLM_MAX_LORA_RANKS if r >= rank), rank)
    rank_flag = "" if rank <= VLLM_DEFAULT_MAX_LORA_RANK else f" --max-lora-rank {limit}"
    modules = shlex.quote(f"{name}={adapter}")
    return (
        "With peft and transformers:\n\n"
        "```python\n"
        "from peft import PeftModel\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        f"base = AutoModelForCausalLM.from_pretrained({base!r})\n"
        f"tokenizer = AutoTokenizer.from_pretrained({base!r})\n"
        f"model = PeftModel.from_pretrained(base, {str(adapter)!r})\n"
        "```\n\n"
        "With vLLM's OpenAI-compatible server (requests then name the model `" + name + "`; "
        "`vllm serve` takes the same options where its console script works, which it does "
        "not in the CPU build):\n\n"
        "```bash\n"
        f"python -m vllm.entrypoints.openai.api_server --model {shlex.quote(base)} "
        f"--enable-lora{rank_flag} --lora-modules {modules}\n"
        "```"
    )
