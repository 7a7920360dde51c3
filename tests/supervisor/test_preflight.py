"""Everything that can be found wrong before launch is found before launch (workbench.supervisor.preflight).

Recipes go through `read_recipe`, the first step of `workbench up` (and of `--dry-run` and
`sweep plan`); a few go through the CLI to show the exit status and that nothing is written
or started. Hub ids are checked in a subprocess: huggingface_hub reads its settings
(HF_HUB_CACHE, HF_HUB_OFFLINE, HF_ENDPOINT) once, at import.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import make_run
from workbench.cli import app
from workbench.config import (
    MAX_EVAL_PROMPTS,
    ConfigError,
    TrainerSection,
    load_orchestrator_config,
    model_to_toml,
)
from workbench.envs import Environment
from workbench.experiment import create_experiment
from workbench.files import layout, run_control
from workbench.models.char_tokenizer import build_char_tokenizer, save_char_tokenizer
from workbench.supervisor import plan as supervisor_plan
from workbench.supervisor.client import running_supervisor_pid
from workbench.supervisor.control_socket import ControlError, new_run_config
from workbench.supervisor.launch import PLAN_ENV, stop_experiment
from workbench.supervisor.preflight import MAX_PROMPTS_MEASURED
from workbench.system.ports import free_port
from workbench.testing import standins
from workbench.up import RecipeError, read_recipe

REPO = Path(__file__).resolve().parents[2]

RECIPE = """\
[experiment]
name = "pre"
output_dir = "{output_dir}"

[model]
base = "{base}"

[inference]
max_model_len = 512

[trainer]
max_concurrent_runs = 2
lora = {{ rank = 8, alpha = 16 }}

[defaults]
env = "reverse_text"
env_args = {{ min_length = 9, max_length = 9 }}
max_steps = 5

[[runs]]
id = "a"

[[runs]]
id = "b"
lr = 1e-3
"""


def recipe_text(tmp_path: Path, base: str = "builtin:tiny-reverse") -> str:
    return RECIPE.format(output_dir=tmp_path / "outputs" / "pre", base=base)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text(text)
    return path


def problems(tmp_path: Path, text: str) -> dict[str, tuple[int | None, str]]:
    """key -> (line, message) of every problem `workbench up` reports for this recipe."""
    with pytest.raises(RecipeError) as raised:
        read_recipe(write(tmp_path, text))
    cause = raised.value.__context__
    assert isinstance(cause, ConfigError), raised.value
    return {p.key: (p.line, p.message) for p in cause.problems}


def test_the_shipped_recipes_pass_every_check_that_needs_no_hub():
    for name in (
        "reverse_text.toml",
        "reverse_text_sweep.toml",
        "reverse_words_dataset.toml",
        "reverse_chain.toml",
    ):
        read_recipe(REPO / "recipes" / name)


def test_an_unknown_environment_is_found_at_its_line_listing_the_known_ones(tmp_path: Path):
    text = recipe_text(tmp_path).replace("lr = 1e-3", 'lr = 1e-3\nenv = "nope"')
    found = problems(tmp_path, text)
    assert list(found) == ["runs[1].env"]
    line, message = found["runs[1].env"]
    assert line == 26 and "unknown environment 'nope'" in message and "reverse_text" in message


def test_an_unknown_env_args_key_is_found_by_the_environments_own_arguments(tmp_path: Path):
    text = recipe_text(tmp_path).replace("min_length = 9,", "min_len = 9,")
    line, message = problems(tmp_path, text)["defaults.env_args"]
    assert line == 17 and "unknown env_args key 'min_len'" in message
    assert "allowed: alphabet, max_history, max_length, min_length, system_prompt" in message


def test_a_task_space_too_small_to_hold_out_eval_prompts_is_found(tmp_path: Path):
    text = recipe_text(tmp_path).replace(
        "min_length = 9, max_length = 9", 'min_length = 1, max_length = 1, alphabet = "ab"'
    )
    _, message = problems(tmp_path, text)["defaults.env_args"]
    assert "no 'eval' prompt" in message and "hold out" in message


def test_a_run_asking_for_a_larger_lora_rank_than_the_trainers_slots_is_found(tmp_path: Path):
    text = recipe_text(tmp_path).replace('id = "a"', 'id = "a"\nlora = { rank = 16 }')
    line, message = problems(tmp_path, text)["runs[0].lora.rank"]
    assert line == 22 and "rank 16 is larger than the trainer's adapter slots" in message
    in_defaults = recipe_text(tmp_path).replace("max_steps = 5", "max_steps = 5\nlora.rank = 32")
    assert "rank 32" in problems(tmp_path, in_defaults)["defaults.lora.rank"][1]


def test_a_local_model_that_is_missing_or_not_a_model_directory_is_found(tmp_path: Path):
    missing = tmp_path / "no-such-model"
    line, message = problems(tmp_path, recipe_text(tmp_path, str(missing)))["model.base"]
    assert line == 6 and f"{missing} does not exist" in message
    empty = tmp_path / "empty-dir"
    empty.mkdir()
    _, message = problems(tmp_path, recipe_text(tmp_path, str(empty)))["model.base"]
    assert "not a model directory (no config.json)" in message
    unknown = recipe_text(tmp_path, "builtin:huge")
    assert "unknown builtin model 'builtin:huge'" in problems(tmp_path, unknown)["model.base"][1]


def test_a_recipe_without_runs_says_so_unless_its_experiment_has_runs_already(tmp_path: Path):
    text = recipe_text(tmp_path).split("[[runs]]")[0]
    _, message = problems(tmp_path, text)["runs"]
    assert "the recipe has no runs" in message
    make_run(tmp_path / "outputs" / "pre", "run_added_earlier")
    read_recipe(write(tmp_path, text))  # `up` resumes the runs the experiment has


def test_a_prompt_plus_max_tokens_above_max_model_len_names_the_numbers(tmp_path: Path):
    # The tiny model's chat template: <bos><|user|>, 9 letters, <eos><|assistant|>: 13 tokens.
    text = recipe_text(tmp_path).replace("max_model_len = 512", "max_model_len = 80")
    text = text.replace("lr = 1e-3", "lr = 1e-3\nsampling.max_tokens = 70")
    found = problems(tmp_path, text)
    assert list(found) == ["runs[1].sampling.max_tokens"]
    line, message = found["runs[1].sampling.max_tokens"]
    assert line == 26 and "training prompts is 13 tokens" in message
    assert "up to 83, above [inference] max_model_len = 80" in message


def test_a_run_whose_own_env_args_make_prompts_too_long_is_blamed_not_the_defaults(
    tmp_path: Path,
):
    text = recipe_text(tmp_path).replace("max_model_len = 512", "max_model_len = 80")
    text = text.replace("lr = 1e-3", "lr = 1e-3\nenv_args.max_length = 40")
    line, message = problems(tmp_path, text)["runs[1].sampling.max_tokens"]
    assert line == 23 and "training prompts is 44 tokens" in message


def test_an_eval_of_its_own_length_and_the_trainers_seq_len_are_checked_too(tmp_path: Path):
    text = recipe_text(tmp_path).replace("max_model_len = 512", "max_model_len = 80")
    text = text.replace("max_concurrent_runs = 2", "max_concurrent_runs = 2\nseq_len = 40")
    text = text.replace("max_steps = 5", "max_steps = 5\neval.sampling.max_tokens = 70")
    found = problems(tmp_path, text)
    assert set(found) == {"defaults.sampling.max_tokens", "defaults.eval.sampling.max_tokens"}
    assert "above [trainer] seq_len = 40" in found["defaults.sampling.max_tokens"][1]
    assert "eval prompts is 13 tokens" in found["defaults.eval.sampling.max_tokens"][1]


def test_a_multi_turn_episode_is_measured_with_every_turn_against_the_trainers_seq_len(
    tmp_path: Path,
):
    text = recipe_text(tmp_path).replace(
        'env = "reverse_text"\nenv_args = { min_length = 9, max_length = 9 }',
        'env = "reverse_chain"\nenv_args = { turns = 4, min_length = 6, max_length = 6 }',
    )
    # One turn would fit 128: a 10-token prompt (<bos>, <|user|>, 6 letters, <eos>,
    # <|assistant|>) and 64 generated. Four do not: the prompt, 3 messages of 8 tokens, 4
    # empty replies of 2 (<|assistant|>, <eos>) make 41, and 4 x 64 replies 256 more.
    text = text.replace("max_concurrent_runs = 2", "max_concurrent_runs = 2\nseq_len = 128")
    text = text.replace("max_steps = 5", "max_steps = 5\nsampling.max_tokens = 64")
    line, message = problems(tmp_path, text)["defaults.sampling.max_tokens"]
    assert line == 20
    assert "training episodes has 41 tokens of prompt and environment messages, and 4 replies" in (
        message
    )
    assert "up to 297, above [trainer] seq_len = 128" in message


def test_a_swept_value_that_fails_is_found_at_the_sweep_key(tmp_path: Path):
    text = recipe_text(tmp_path).replace("max_model_len = 512", "max_model_len = 80")
    text += "\n[sweep.grid]\nenv_args.max_length = [9, 40]\n"
    found = problems(tmp_path, text)
    assert list(found) == ["sweep.grid.env_args.max_length"]
    line, message = found["sweep.grid.env_args.max_length"]
    assert line == 28 and "training prompts is 44 tokens" in message


def test_max_loras_below_the_adapters_in_flight_explains_the_count(tmp_path: Path):
    text = recipe_text(tmp_path).replace("[inference]", "[inference]\nmax_loras = 3")
    line, message = problems(tmp_path, text)["inference.max_loras"]
    assert line == 9
    assert "2 runs train at once" in message and "an eval holds" in message
    assert "4 in flight" in message and "at least 4" in message
    # Without evals a run has one adapter in flight; left out, max_loras fits every slot.
    read_recipe(write(tmp_path, text.replace("max_steps = 5", "max_steps = 5\neval.interval = 0")))
    _, recipe = read_recipe(write(tmp_path, recipe_text(tmp_path)))
    assert recipe.max_loras == 4 and recipe.inference_config().inference.max_loras == 4


def test_every_problem_is_reported_at_once(tmp_path: Path):
    text = recipe_text(tmp_path, str(tmp_path / "gone")).replace("lr = 1e-3", 'env = "nope"')
    text = text.replace("[inference]", "[inference]\nmax_loras = 1")
    text = text.replace('id = "a"', 'id = "a"\nlora.rank = 64')
    assert set(problems(tmp_path, text)) == {
        "model.base",
        "runs[0].lora.rank",
        "runs[1].env",
        "inference.max_loras",
    }


def test_up_with_a_run_that_cannot_work_exits_2_and_writes_and_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(PLAN_ENV, standins.PLAN_REFERENCE)  # were it to start: stand-ins
    recipe = write(tmp_path, recipe_text(tmp_path).replace("lr = 1e-3", 'env = "nope"'))
    experiment = tmp_path / "outputs" / "pre"
    try:
        result = CliRunner().invoke(app, ["up", str(recipe), "--detach"])
    finally:
        if running_supervisor_pid(experiment) is not None:
            stop_experiment(experiment)
    assert result.exit_code == 2, result.output
    assert f"{recipe}, line 25: runs[1].env: unknown environment 'nope'" in result.output
    assert not experiment.exists()


def test_runs_add_checks_the_new_run_against_the_experiment(tmp_path: Path):
    text = recipe_text(tmp_path).replace("[inference]", "[inference]\nmax_loras = 4")
    document, recipe = read_recipe(write(tmp_path, text))
    experiment = create_experiment(recipe, document)

    def refusal(overrides: dict) -> str:
        with pytest.raises(ControlError) as raised:
            new_run_config(experiment, "c", overrides)
        return str(raised.value)

    assert "run_c settings: env: unknown environment 'x'" in refusal({"env": "x"})
    assert "run_c settings: lora.rank: rank 9" in refusal({"lora.rank": 9})
    assert "run_c settings: lr: must be a finite number" in refusal({"lr": float("inf")})
    assert "every advantage is 0" in refusal({"rollouts_per_prompt": 1, "batch_size": 4})
    too_long = refusal({"sampling.max_tokens": 600})
    assert "run_c settings: sampling.max_tokens:" in too_long and "max_model_len = 512" in too_long
    # Two runs with evals fill max_loras = 4; a third may take a slot once one frees.
    assert new_run_config(experiment, "c", {})[0] == "run_c"
    text = text.replace("max_concurrent_runs = 2", "max_concurrent_runs = 3")
    (experiment / "recipe.toml").write_text(text)
    crowded = refusal({})
    assert "run_c settings: inference.max_loras: 4 is fewer adapters" in crowded
    assert "with run_c, 3 runs, 3 trainer slots" in crowded and "6 in flight" in crowded
    run_control.write_eviction(experiment / "run_a", "made room", by="user")
    assert new_run_config(experiment, "c", {})[0] == "run_c"
    assert not (experiment / "run_c").exists()


def test_runs_add_reads_a_runs_changed_settings_again(tmp_path: Path):
    # add_run remembers what each run's orch.toml said while the file does not change; a
    # run whose settings changed counts with its new ones.
    text = recipe_text(tmp_path).replace("[inference]", "[inference]\nmax_loras = 4")
    text = text.replace("max_concurrent_runs = 2", "max_concurrent_runs = 3")
    document, recipe = read_recipe(write(tmp_path, text))
    experiment = create_experiment(recipe, document)
    with pytest.raises(ControlError, match="6 in flight"):
        new_run_config(experiment, "c", {})
    # Both runs' evals turned off (as a user editing orch.toml would): one adapter each.
    for run_id in ("run_a", "run_b"):
        path = layout.orch_config_path(experiment / run_id)
        config = load_orchestrator_config(path)
        config.eval.interval = 0
        path.write_text(model_to_toml(config), encoding="utf-8")
    assert new_run_config(experiment, "c", {})[0] == "run_c"


def test_a_prompt_is_tokenized_once_however_many_runs_add_it(tmp_path: Path, monkeypatch):
    # The supervisor measures each added run's prompts on its one thread: a run added like
    # the last one (same environment, same seed) has the same prompts, measured already.
    from workbench.models.resolve import prompt_tokenizer
    from workbench.supervisor import preflight

    document, recipe = read_recipe(write(tmp_path, recipe_text(tmp_path)))
    experiment = create_experiment(recipe, document)
    tokenizer = prompt_tokenizer("builtin:tiny-reverse")
    rendered = []
    render = tokenizer.apply_chat_template
    monkeypatch.setattr(
        tokenizer, "apply_chat_template", lambda *a, **k: rendered.append(1) or render(*a, **k)
    )
    monkeypatch.setattr(preflight, "_PROMPT_TOKENS", preflight.OrderedDict())
    new_run_config(experiment, "c", {})
    first = len(rendered)
    assert first > 0
    new_run_config(experiment, "d", {})
    assert len(rendered) == first
    new_run_config(experiment, "e", {"seed": 7})  # other prompts: measured
    assert len(rendered) > first


# ---------------------------------------------------------------- numbers


def test_target_modules_are_checked_against_the_base_models_linear_layers(tmp_path: Path):
    modules = 'target_modules = ["q_proj", "nope_proj"]'
    text = recipe_text(tmp_path).replace(
        "max_concurrent_runs = 2", f"max_concurrent_runs = 2\n{modules}"
    )
    line, message = problems(tmp_path, text)["trainer.target_modules"]
    assert line == 13
    assert "'nope_proj' is not a linear layer of builtin:tiny-reverse" in message
    assert "down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj" in message
    read_recipe(write(tmp_path, text.replace(', "nope_proj"', ', "lm_head"')))


def model_dir(tmp_path: Path, config) -> Path:
    """A model directory with a config and a tokenizer, and no weights: the check of
    target_modules reads the config alone."""
    directory = tmp_path / "model"
    config.save_pretrained(directory)
    save_char_tokenizer(build_char_tokenizer(), directory)
    return directory


def test_default_target_modules_matching_no_layer_of_the_model_are_found(tmp_path: Path):
    from transformers import GPTNeoXConfig

    config = GPTNeoXConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64
    )
    text = recipe_text(tmp_path, str(model_dir(tmp_path, config)))
    line, message = problems(tmp_path, text)["trainer"]
    assert line == 11 and "none of the default target_modules (q_proj, k_proj" in message
    assert "dense, dense_4h_to_h, dense_h_to_4h, lm_head, query_key_value" in message
    modules = '\ntarget_modules = ["query_key_value", "dense"]'
    read_recipe(
        write(
            tmp_path, text.replace("max_concurrent_runs = 2", "max_concurrent_runs = 2" + modules)
        )
    )


def test_the_layers_of_a_large_model_are_known_without_allocating_its_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from transformers import LlamaConfig

    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path / "cache"))  # looked at, not kept

    # A 70B Llama: 280 GB in float32, were its weights made.
    config = LlamaConfig(
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=128256,
    )
    text = recipe_text(tmp_path, str(model_dir(tmp_path, config))).replace(
        "max_concurrent_runs = 2", 'max_concurrent_runs = 2\ntarget_modules = ["qkv_proj"]'
    )
    _, message = problems(tmp_path, text)["trainer.target_modules"]
    assert "'qkv_proj' is not a linear layer" in message
    # The look is taken in a child process (torch stays out of `workbench up`), which never
    # held more than torch and transformers take.
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss < 4 * 1024 * 1024  # KiB


def test_adapter_ranks_are_ones_vllm_serves(tmp_path: Path):
    # vLLM's --max-lora-rank takes 1, 8, 16, 32, ... only: a trainer rank of 4 is served
    # under 8, where it used to be passed as 4 and stop vLLM at startup.
    small = recipe_text(tmp_path).replace("rank = 8, alpha = 16", "rank = 4, alpha = 8")
    _, recipe = read_recipe(write(tmp_path, small))
    assert recipe.inference_config().max_lora_rank == 8
    huge = recipe_text(tmp_path).replace("rank = 8, alpha = 16", "rank = 600, alpha = 16")
    line, message = problems(tmp_path, huge)["trainer.lora.rank"]
    assert line == 13 and "rank 600, above 512, the largest adapter rank vLLM serves" in message
    odd = recipe_text(tmp_path).replace("[inference]", "[inference]\nmax_lora_rank = 12")
    line, message = problems(tmp_path, odd)["inference.max_lora_rank"]
    assert line == 9 and "would not start with 12; use 16" in message
    below = recipe_text(tmp_path).replace("[inference]", "[inference]\nmax_lora_rank = 1")
    line, message = problems(tmp_path, below)["defaults.lora.rank"]
    assert "the run's adapters have rank 8, above [inference] max_lora_rank = 1" in message


def with_gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(supervisor_plan, "detect_gpu_count", lambda: count)


def test_float16_without_a_gpu_is_refused_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    text = recipe_text(tmp_path).replace(
        "max_concurrent_runs = 2", 'max_concurrent_runs = 2\ndtype = "float16"'
    )
    with_gpus(monkeypatch, 0)
    line, message = problems(tmp_path, text)["trainer.dtype"]
    assert line == 13 and "float16 without a GPU: the trainer and vLLM" in message
    assert "loss nan" in message and 'dtype = "bfloat16"' in message
    served = recipe_text(tmp_path).replace("[inference]", '[inference]\ndtype = "half"')
    line, message = problems(tmp_path, served)["inference.dtype"]
    assert line == 9 and "float16 without a GPU: vLLM" in message
    with_gpus(monkeypatch, 1)
    read_recipe(write(tmp_path, text))


def test_gpus_the_machine_lacks_and_a_port_in_use_are_found_before_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        text = recipe_text(tmp_path).replace("[inference]", f"[inference]\nport = {port}")
        text = text.replace("max_concurrent_runs = 2", "max_concurrent_runs = 2\ngpus = [5]")
        with_gpus(monkeypatch, 2)
        found = problems(tmp_path, text)
    assert found["inference.port"][0] == 9 and f"port {port}" in found["inference.port"][1]
    assert "already in use" in found["inference.port"][1]
    line, message = found["trainer.gpus"]
    assert line == 14 and "[trainer] gpus lists [5], but this machine has 2 GPU(s)" in message
    with_gpus(monkeypatch, 0)  # without GPUs the lists are ignored; the port is free again
    read_recipe(write(tmp_path, text))


def test_a_rendezvous_interface_this_machine_lacks_is_found_at_its_line(tmp_path: Path):
    text = recipe_text(tmp_path).replace(
        "max_concurrent_runs = 2", 'max_concurrent_runs = 2\nrendezvous_interface = "nosuch0"'
    )
    line, message = problems(tmp_path, text)["trainer.rendezvous_interface"]
    assert line == 13 and "'nosuch0' is not a network interface of this machine" in message


def test_several_nodes_without_a_fixed_rendezvous_port_are_refused_at_the_key(tmp_path: Path):
    text = recipe_text(tmp_path).replace("max_concurrent_runs = 2", "nnodes = 2")
    assert "nnodes = 2 needs a fixed port" in problems(tmp_path, text)["trainer.rendezvous_port"][1]


def test_shared_prompts_with_an_attention_that_cannot_run_them_are_refused_at_the_key(
    tmp_path: Path,
):
    text = recipe_text(tmp_path).replace(
        "max_concurrent_runs = 2",
        'max_concurrent_runs = 2\nattention = "varlen"\nshare_prompts = true',
    )
    message = problems(tmp_path, text)["trainer.share_prompts"][1]
    assert "share_prompts = true needs attention per_sample or dense, not 'varlen'" in message
    # "auto" shares where the attention resolves to a path that runs it; `true` with an
    # attention "auto" that resolves elsewhere (CUDA's varlen) is refused by the trainer.
    assert TrainerSection(attention="varlen").shares_prompts("varlen") is False
    assert TrainerSection().shares_prompts("per_sample") is True
    with pytest.raises(ValueError, match="attention = \"auto\" resolved to 'flex'"):
        TrainerSection(share_prompts=True).shares_prompts("flex")


def test_vllm_parallelism_the_machine_cannot_give_is_found_at_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    text = recipe_text(tmp_path).replace(
        "[inference]", "[inference]\ntensor_parallel_size = 2\ndata_parallel_size = 2"
    )
    with_gpus(monkeypatch, 2)
    line, message = problems(tmp_path, text)["inference.tensor_parallel_size"]
    assert line == 9 and "= 4 GPUs for vLLM, but this machine has 2" in message
    with_gpus(monkeypatch, 4)
    read_recipe(write(tmp_path, text))


def test_prompt_lengths_are_measured_on_a_bounded_number_of_prompts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    drawn: list[int] = []
    sample_prompts = Environment.sample_prompts

    def counted(self, n, **kwargs):
        drawn.append(n)
        return sample_prompts(self, n, **kwargs)

    monkeypatch.setattr(Environment, "sample_prompts", counted)
    huge = (
        f"max_steps = 5\nbatch_size = 8000000000\neval.num_prompts = {MAX_EVAL_PROMPTS}\n"
        "eval.sampling.max_tokens = 100"
    )
    text = recipe_text(tmp_path).replace("max_steps = 5", huge)
    text = text.replace("max_model_len = 512", "max_model_len = 40")
    started = time.monotonic()
    found = problems(tmp_path, text)
    assert time.monotonic() - started < 60
    assert drawn and max(drawn) == MAX_PROMPTS_MEASURED
    training = found["defaults.sampling.max_tokens"][1]
    assert f"the longest of the run's first {MAX_PROMPTS_MEASURED} training prompts" in training
    evals = found["defaults.eval.sampling.max_tokens"][1]
    assert f"the longest of the run's {MAX_EVAL_PROMPTS} eval prompts" in evals


def test_an_eval_of_a_million_prompts_is_refused_naming_the_largest_that_works(tmp_path: Path):
    text = recipe_text(tmp_path).replace(
        "max_steps = 5", "max_steps = 5\neval.num_prompts = 1000000"
    )
    found = problems(tmp_path, text)
    assert f"use at most {MAX_EVAL_PROMPTS}" in found["defaults.eval.num_prompts"][1]


def test_a_task_space_too_small_to_hold_out_an_eval_set_is_refused(tmp_path: Path):
    tiny = 'env = "letter_count"\nenv_args = { min_length = 3, max_length = 3, alphabet = "ab" }'
    text = recipe_text(tmp_path).replace(
        'env = "reverse_text"\nenv_args = { min_length = 9, max_length = 9 }', tiny
    )
    message = problems(tmp_path, text)["defaults.env_args"][1]
    assert "task space" in message and "eval.num_prompts to at most" in message
    # Without evals the same task space is fine.
    read_recipe(write(tmp_path, text.replace("max_steps = 5", "max_steps = 5\neval.interval = 0")))


def test_texts_too_long_for_any_context_are_refused_before_any_is_made(tmp_path: Path):
    lengths = "env_args = { min_length = 9, max_length = 1000000000 }"
    text = recipe_text(tmp_path).replace("env_args = { min_length = 9, max_length = 9 }", lengths)
    started = time.monotonic()
    line, message = problems(tmp_path, text)["defaults.env_args"]
    assert time.monotonic() - started < 60
    assert line == 17 and "texts are at most 10000 characters long" in message


def test_up_writes_nothing_when_a_check_of_the_model_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(PLAN_ENV, standins.PLAN_REFERENCE)  # were it to start: stand-ins
    text = recipe_text(tmp_path).replace(
        "max_concurrent_runs = 2", 'max_concurrent_runs = 2\ntarget_modules = ["nope_proj"]'
    )
    text = text.replace("lr = 1e-3", "lr = inf")
    recipe = write(tmp_path, text)
    experiment = tmp_path / "outputs" / "pre"
    try:
        result = CliRunner().invoke(app, ["up", str(recipe), "--detach"])
    finally:
        if running_supervisor_pid(experiment) is not None:
            stop_experiment(experiment)
    assert result.exit_code == 2, result.output
    assert f"{recipe}, line 26: runs[1].lr: must be a finite number (got inf)" in result.output
    assert not experiment.exists()


# ---------------------------------------------------------------- hub ids


def hub_cache_with(cache: Path, repo_id: str) -> None:
    """A Hugging Face cache holding `repo_id` (config and tokenizer), as a download leaves it."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_char_tokenizer(build_char_tokenizer(), snapshot)


def dry_run(tmp_path: Path, base: str, **env: str) -> subprocess.CompletedProcess[str]:
    recipe = write(tmp_path, recipe_text(tmp_path, base))
    return subprocess.run(
        [sys.executable, "-m", "workbench.cli", "up", str(recipe), "--dry-run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        timeout=120,
    )


def test_a_hub_id_in_the_cache_needs_no_network(tmp_path: Path):
    cache = tmp_path / "hf"
    hub_cache_with(cache, "acme/tiny")
    # Offline, and a hub that cannot answer: only the cache can make this pass.
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    result = dry_run(tmp_path, "acme/tiny", **env)
    assert result.returncode == 0, result.stderr
    assert "nothing was written or started" in result.stdout


def test_a_hub_id_neither_cached_nor_downloadable_offline_is_refused(tmp_path: Path):
    env = {"HF_HUB_CACHE": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    result = dry_run(tmp_path, "acme/tiny", **env)
    assert result.returncode == 2
    assert "model.base: 'acme/tiny' is not in the Hugging Face cache" in result.stderr
    assert "HF_HUB_OFFLINE is set" in result.stderr


def test_a_hub_id_not_cached_on_a_machine_that_cannot_reach_the_hub_is_refused(tmp_path: Path):
    unreachable = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    env = {"HF_HUB_CACHE": str(tmp_path / "hf"), "HF_ENDPOINT": unreachable}
    result = dry_run(tmp_path, "acme/tiny", **env)
    assert result.returncode == 2
    assert "the hub cannot be reached" in result.stderr and unreachable in result.stderr


def test_a_models_layers_are_looked_at_once_and_again_when_its_config_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from transformers import GPTNeoXConfig

    from workbench.models import resolve

    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path / "cache"))
    config = GPTNeoXConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64
    )
    base = str(model_dir(tmp_path, config))
    looked = resolve.linear_layer_names(base)
    assert "query_key_value" in looked
    resolve.model_shapes.cache_clear()  # as a second `workbench up` starts afresh

    def no_child(*args, **kwargs):
        raise AssertionError("the layers were looked at again")

    monkeypatch.setattr(resolve.subprocess, "run", no_child)
    assert resolve.linear_layer_names(base) == looked
    resolve.model_shapes.cache_clear()
    config.num_hidden_layers = 2  # another model: another look
    config.save_pretrained(base)
    with pytest.raises(AssertionError, match="looked at again"):
        resolve.linear_layer_names(base)
