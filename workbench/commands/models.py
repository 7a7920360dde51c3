"""`workbench sft` and `workbench model ...`: training and building a model outside an
experiment. The work is `workbench.trainer.sft.flow` (sft) and `workbench.models` (build);
torch loads only when one of them runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from workbench.commands.common import EXIT_BAD_INPUT, command_group, err_console, fail, say, warn
from workbench.trainer.sft.flow import SFTInputError, describe_result, run_sft

model_app = command_group("model", "The models the project builds itself (builtin:tiny-reverse).")


# `sft`'s options, named once here so its signature reads as a list of settings.
OutputDir = Annotated[
    Path, typer.Option("--output-dir", "-o", help="Where to save the model (or LoRA adapter).")
]
ModelOption = Annotated[
    str, typer.Option(help="builtin:tiny-reverse, a local model directory or a hub id.")
]
EnvOption = Annotated[
    str | None, typer.Option(help="Train on this environment's prompts and reference answers.")
]
EnvArgs = Annotated[
    list[str] | None,
    typer.Option(
        "--env-arg",
        metavar="KEY=VALUE",
        help="Environment argument, repeatable, e.g. --env-arg max_length=8.",
    ),
]
DataFile = Annotated[
    Path | None,
    typer.Option(help='JSONL file of {"prompt", "completion"} or {"messages"} lines.'),
]
Steps = Annotated[int, typer.Option(min=1, help="Optimizer steps.")]
BatchSize = Annotated[int, typer.Option(min=1, help="Examples per step.")]
LearningRate = Annotated[float, typer.Option(min=0.0, help="AdamW learning rate.")]
WarmupSteps = Annotated[int, typer.Option(min=0, help="Linear warm-up steps.")]
Schedule = Annotated[str, typer.Option(help="constant or cosine (after warm-up).")]
Seed = Annotated[int, typer.Option(help="Seeds the data order and initialisation.")]
LoraFlag = Annotated[
    bool, typer.Option("--lora/--full", help="Train a LoRA adapter, or every weight.")
]
EvalPrompts = Annotated[
    int, typer.Option(min=0, help="Greedy reward on this many held-out prompts (needs --env).")
]
EvalEvery = Annotated[int, typer.Option(min=0, help="Also evaluate every N steps.")]
Threads = Annotated[
    int | None, typer.Option(min=1, help="torch threads; 1 is fastest for builtin:tiny-reverse.")
]
AsJson = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]


def sft(
    output_dir: OutputDir,
    model: ModelOption = "builtin:tiny-reverse",
    env: EnvOption = None,
    env_arg: EnvArgs = None,
    data: DataFile = None,
    steps: Steps = 200,
    batch_size: BatchSize = 64,
    lr: LearningRate = 1e-3,
    warmup_steps: WarmupSteps = 0,
    schedule: Schedule = "constant",
    seed: Seed = 0,
    lora: LoraFlag = False,
    lora_rank: Annotated[int, typer.Option(min=1)] = 8,
    lora_alpha: Annotated[float, typer.Option(min=0.0)] = 16.0,
    eval_prompts: EvalPrompts = 0,
    eval_every: EvalEvery = 0,
    threads: Threads = None,
    as_json: AsJson = False,
) -> None:
    """Supervised fine-tuning of one model on chat (prompt, completion) pairs.

    The data is an environment's prompt stream (--env reverse_text) or a JSONL file (--data).
    The loss covers completion tokens only. Full fine-tuning saves a Hugging Face model
    directory; --lora saves a peft adapter (adapter_config.json, adapter_model.safetensors).
    The output appears whole when training ends, with sft_summary.json (losses, rewards).
    This is how builtin:tiny-reverse is warmed up.
    """
    settings = {
        "model": model,
        "output_dir": output_dir,
        "env": env,
        "data": data,
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "warmup_steps": warmup_steps,
        "schedule": schedule,
        "seed": seed,
        "eval_prompts": eval_prompts,
        "eval_every": eval_every,
        "threads": threads,
    }
    try:
        result = run_sft(
            settings,
            env_args=env_arg,
            lora_rank=lora_rank if lora else None,
            lora_alpha=lora_alpha,
            console=err_console,
            progress=None if as_json else warn,
        )
    except SFTInputError as err:
        raise fail(str(err), EXIT_BAD_INPUT) from None
    except OSError as err:
        raise fail(str(err)) from None
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
        return
    say(describe_result(result, lora=lora))


@model_app.command("build")
def model_build(
    name: Annotated[
        str, typer.Argument(help="The builtin model to build.")
    ] = "builtin:tiny-reverse",
    from_scratch: Annotated[
        bool,
        typer.Option(
            "--from-scratch",
            help="Train it from its seed into --output-dir instead of using the shipped weights "
            "(how the shipped weights were made; other processors give other bits).",
        ),
    ] = False,
    output_dir: Annotated[
        Path | None,
        typer.Option("--output-dir", "-o", help="With --from-scratch: a new directory."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the build info as JSON.")] = False,
) -> None:
    """Write a builtin model into the cache now (it is otherwise written on first use).

    Prints its directory and build info (parameters, warm-up time, greedy rewards, the
    sha256 of its files and the machine that made them). builtin:tiny-reverse ships its
    weights, so this copies and checks them. --from-scratch -o DIR trains the model from its
    seed into DIR instead, recording in DIR/build.json how it was made: that is how the
    shipped weights were made (`-o workbench/models/weights/tiny-reverse` replaces them).
    The cache is $WORKBENCH_CACHE_DIR/models, else ~/.cache/workbench/models on Linux.
    """
    from workbench.models import ModelResolutionError, is_builtin, resolve_model
    from workbench.models.shipped import read_build_info

    if not is_builtin(name):
        raise fail(f"{name!r} is not a builtin model (builtin:tiny-reverse)", EXIT_BAD_INPUT)
    if from_scratch != (output_dir is not None):
        raise fail("--from-scratch and --output-dir go together", EXIT_BAD_INPUT)
    try:
        if output_dir is not None:
            path = _build_from_scratch(name, output_dir)
        else:
            path = resolve_model(name, console=err_console)
    except ModelResolutionError as err:
        raise fail(str(err)) from None
    info = read_build_info(path) or {}
    if as_json:
        print(json.dumps({"path": str(path), **info}, indent=2))
        return
    say(str(path))
    for key in ("params", "warmup_seconds", "greedy_reward", "made_with"):
        if key in info:
            say(f"  {key}: {info[key]}")


def _build_from_scratch(name: str, output_dir: Path) -> Path:
    """Train builtin `name` from its default spec into the new directory `output_dir`,
    written whole or not at all, with its files' digests recorded."""
    from workbench.files import layout
    from workbench.models.resolve import BUILTIN_PREFIX, get_builtin
    from workbench.models.shipped import record_shipment

    if output_dir.exists():
        raise fail(f"{output_dir} exists; name a new directory", EXIT_BAD_INPUT)
    builtin = get_builtin(name.removeprefix(BUILTIN_PREFIX))
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    with layout.staged_directory(output_dir) as staging:
        builtin.build_from_scratch(
            staging, builtin.default_spec(), show_progress=True, console=err_console
        )
        record_shipment(staging, f"workbench model build {name} --from-scratch -o {output_dir}")
    # The marker says the cache's copy is whole; shipped files are checked by their digests.
    (output_dir / layout.STABLE).unlink(missing_ok=True)
    return output_dir
