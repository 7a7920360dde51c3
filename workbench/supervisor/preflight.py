"""What can be found wrong with a recipe, or a run to add, before anything starts.

`workbench.config` and `workbench.recipe` check a file on its own terms: keys, types, values, rules
across the keys of one table. This module checks what takes more than the file, the way
the processes will meet it:

- the recipe has runs (else the supervisor would start with nothing to do);
- `[model] base` can be loaded here: a known builtin, a model directory, a hub id that is
  cached or can be downloaded (`workbench.models.resolve.base_model_problem`);
- `[trainer] target_modules` names linear layers of the base model (its config made on the
  meta device: no weights read), and the trainer's dtype computes on this machine;
- the GPU lists name GPUs this machine has, a fixed `[inference] port` is free, and the
  trainer's rendezvous interface exists here with its fixed port free;
- each run's environment exists and takes its `env_args`, and its task space can hold
  out eval prompts; its `lora.rank` fits the trainer's adapter slots;
- each run's longest prompt (rendered by the base model's chat template and tokenizer, as
  vLLM renders it) plus its `max_tokens` fits vLLM's `max_model_len`, and a training
  sample fits the trainer's `seq_len`: at most `MAX_PROMPTS_MEASURED` prompts of each
  split are measured, whatever the batch size or the number of eval prompts;
- vLLM's `max_loras` holds every adapter version in flight: the runs that can train at
  once, each with its newest adapter and, while an eval of it runs, an older one;
- the trainer's slots and vLLM's adapters fit in memory (`workbench.supervisor.slots`,
  sized by the caller, which also turns `max_concurrent_runs = "auto"` into a number).

`check_recipe` serves `workbench up` (and `--dry-run`, `sweep plan`): problems name the
file, line and key like the loader's. `check_new_run` serves `workbench runs add` and the
supervisor's add_run. A run's orchestrator calls `checked_environment` before it waits
for anything, for run directories written by hand, and trains with what it built: that
check lives below the environments (`workbench.envs.checks`), so the orchestrator process
imports nothing of the supervisor.
"""

from __future__ import annotations

import functools
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

from workbench.config import (
    MAX_ADAPTERS_IN_FLIGHT,
    ConfigError,
    ConfigProblem,
    OrchestratorConfig,
    deep_merge,
    load_orchestrator_config,
    lora_rank_problem,
    nest_dotted,
    problem_at,
    served_rank_problem,
)
from workbench.envs import Environment, EnvironmentConfigError, MultiTurnEnvironment, Prompt
from workbench.envs.checks import (
    BuiltEnvironment,
    Finding,
    cached_environment,
    environment_key,
    environment_problem,
)
from workbench.files import layout, run_control
from workbench.models.adapters import init_adapter_problem
from workbench.models.resolve import base_model_problem, linear_layer_names, prompt_tokenizer
from workbench.recipe import Recipe, RunSpec
from workbench.supervisor import plan as supervisor_plan
from workbench.supervisor.devices import device_problems
from workbench.supervisor.slots import SlotSizing
from workbench.sweep.checks import read_params
from workbench.system.file_change import OnFileChange

# Training prompts measured per run (at least a step's worth): the first ones it will use.
TRAINING_PROMPTS_MEASURED = 256
# The most prompts of one split measured per run, so that the checks take the same time
# whatever batch_size or eval.num_prompts say (eval.num_prompts = 50000 took 16 s before):
# 4096 reverse_text prompts are drawn and rendered in 0.3 s with builtin:tiny-reverse's
# tokenizer on a loaded 2-core machine.
MAX_PROMPTS_MEASURED = 4096

# float16 on the CPU: a run went to loss nan at its second update, and vLLM then answered
# every request with 400 "Out of range float values are not JSON compliant". The trainer
# alone does not show it: 8 updates of builtin:tiny-reverse on this project's 2-core CPU
# machine (reverse_text, 8 prompts x 8 completions the model sampled itself, lr 3e-3) stay
# finite in float16 and follow float32 (update 5: loss -0.009160 against -0.009145; grad
# norms within 10%), so vLLM's float16 CPU kernels are the likelier source. Either way
# float16 has 5 exponent bits (above 65504 overflows) and nothing here scales the loss;
# bfloat16 has float32's range.
FLOAT16_ON_CPU = (
    "float16 without a GPU: {what} would compute in it on the CPU, where a run went to loss "
    "nan at its second update and vLLM then failed every request (its log-probs were not "
    "finite); float16's range is narrow (above 65504 overflows) and nothing scales the "
    'loss. Use dtype = "bfloat16" (float32\'s range in half the memory) or "float32" on '
    "the CPU"
)


def check_recipe(
    recipe: Recipe, path: Path | str | None, text: str | None, sizing: SlotSizing | None = None
) -> None:
    """Raise ConfigError listing every problem of a valid-looking recipe, or return. With
    `sizing` (`workbench.supervisor.slots`), slots and adapters that do not fit in memory
    are one."""
    problems = recipe_problems(recipe, text)
    if sizing is not None and (memory := sizing.problem(recipe, text)) is not None:
        problems.append(memory)
    if problems:
        raise ConfigError(path, problems)


def recipe_problems(recipe: Recipe, text: str | None) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    if not recipe.runs and not layout.list_run_dirs(recipe.output_dir):
        problems.append(
            problem_at(
                ("runs",),
                "the recipe has no runs: add a [[runs]] table with an id (or a [sweep]); "
                "without one the supervisor would start with nothing to train",
                text,
            )
        )
    tokenizer = None
    model = base_model_problem(recipe.model.base)
    if model is None:
        tokenizer, model = _tokenizer(recipe.model.base)
    if model is not None:
        problems.append(problem_at(("model", "base"), model, text))
    else:
        targets = target_modules_problem(recipe)
        if targets is not None:
            problems.append(problem_at(targets[0], targets[1], text))
    for loc, message in machine_problems(recipe):
        problems.append(problem_at(loc, message, text))
    if recipe.max_lora_rank is None:
        rank = recipe.trainer.lora.rank
        served = served_rank_problem(rank, None, whose="the trainer's adapter slots have")
        problems.append(problem_at(("trainer", "lora", "rank"), str(served), text))
    checker = RunChecker(recipe, tokenizer)
    where: _KeyLocator | None = None  # made for the first finding: it reads the sweep's keys
    configs = recipe.run_configs()
    try:
        for position, spec in enumerate(recipe.runs):
            for key, message in checker.findings(configs[spec.run_id]):
                where = where or _KeyLocator(recipe, checker)
                problems.append(problem_at(where.loc(position, spec, key), message, text))
    finally:
        checker.close()
    if recipe.inference.max_loras is not None:
        loras = max_loras_problem(
            recipe.inference.max_loras,
            recipe.trainer.max_concurrent_runs,
            [config.adapters_in_flight for config in configs.values()],
            what=f"the recipe's {len(configs)}",
            advice="or leave it out (the default is max_concurrent_runs x "
            f"{MAX_ADAPTERS_IN_FLIGHT})",
        )
        if loras is not None:
            problems.append(problem_at(("inference", "max_loras"), loras, text))
    return problems


def target_modules_problem(recipe: Recipe) -> tuple[tuple[str, ...], str] | None:
    """Why `[trainer] target_modules` would give the base model no adapter, or not the ones
    it names, as (location, message); None when they are linear layers of the model, or the
    model's layers cannot be known here (a hub model not cached: nothing is downloaded)."""
    base, trainer = recipe.model.base, recipe.trainer
    try:
        linears = linear_layer_names(base)
    except Exception:  # a config transformers cannot build: the trainer says why
        return None
    if linears is None:
        return None
    names = ", ".join(linears)
    unknown = [module for module in trainer.target_modules if module not in linears]
    if "target_modules" in trainer.model_fields_set:
        if not unknown:
            return None
        listed = ", ".join(repr(module) for module in unknown)
        verb = "is not a linear layer" if len(unknown) == 1 else "are not linear layers"
        return (
            ("trainer", "target_modules"),
            f"{listed} {verb} of {base}, whose linear layers are named (by the last part of "
            f"their module path) {names}; a name that matches none gives no layer an "
            "adapter",
        )
    if len(unknown) < len(trainer.target_modules):
        return None  # the default names some of the model's layers: those get adapters
    return (
        ("trainer",),
        f"none of the default target_modules ({', '.join(trainer.target_modules)}) is a "
        f"linear layer of {base}, so no layer would get an adapter; its linear layers are "
        f"named {names}: set [trainer] target_modules to those that should",
    )


def machine_problems(recipe: Recipe) -> list[tuple[tuple[str, ...], str]]:
    """What the recipe asks of this machine that it cannot give, as (location, message): GPUs
    it does not have, a network interface it does not have, a fixed port in use, float16
    without a GPU."""
    problems: list[tuple[tuple[str, ...], str]] = []
    gpu_count = supervisor_plan.detect_gpu_count()
    inference, trainer = recipe.inference, recipe.trainer
    for key, message in device_problems(
        inference.gpus,
        trainer.gpus,
        trainer.nproc_per_node,
        gpu_count,
        inference.tensor_parallel_size * inference.data_parallel_size,
    ):
        problems.append((tuple(key.split(".")), message))
    if inference.port:
        port = supervisor_plan.port_problem(inference.port, inference.host)
        if port is not None:
            problems.append((("inference", "port"), port))
    for key, message in supervisor_plan.rendezvous_problems(
        trainer.rendezvous_interface, trainer.rendezvous_port
    ):
        problems.append((tuple(key.split(".")), message))
    if gpu_count == 0:
        # vLLM's "auto" is the trainer's dtype; "half" is its other name for float16.
        served = recipe.inference_config().inference.dtype in ("float16", "half")
        if trainer.dtype == "float16":
            what = "the trainer and vLLM" if served else "the trainer"
            problems.append((("trainer", "dtype"), FLOAT16_ON_CPU.format(what=what)))
        elif served:
            problems.append((("inference", "dtype"), FLOAT16_ON_CPU.format(what="vLLM")))
    return problems


def check_new_run(
    experiment: Path, recipe: Recipe | None, run_id: str, config: OrchestratorConfig
) -> None:
    """Raise ConfigError (named `<run> settings`, as the add_run errors) if the run cannot
    work in this experiment. Without a recipe (an experiment made by hand) only what needs
    none is checked: its environment."""
    where = f"{run_id} settings"
    if recipe is None:
        problem = environment_problem(config)
        if problem is not None:
            raise ConfigError(where, [ConfigProblem(key=problem[0], message=problem[1])])
        return
    # The experiment's model is not the new run's business: its prompts are measured when
    # the tokenizer is at hand, and nothing is downloaded for it.
    checker = RunChecker(recipe, _tokenizer(recipe.model.base)[0])
    try:
        problems = [
            ConfigProblem(key=key, message=message) for key, message in checker.findings(config)
        ]
    finally:
        checker.close()
    live = _adapters_in_flight_of_open_runs(experiment)
    loras = max_loras_problem(
        recipe.max_loras,
        recipe.trainer.max_concurrent_runs,
        [*live, config.adapters_in_flight],
        what=f"with {run_id}, {len(live) + 1}",
        advice="or evict a run first (a restart of the experiment takes a new max_loras)",
    )
    if loras is not None:
        problems.append(ConfigProblem(key="inference.max_loras", message=loras))
    if problems:
        raise ConfigError(where, problems)


def max_loras_problem(
    max_loras: int, slots: int, in_flight: list[int], *, what: str, advice: str
) -> str | None:
    """Why `max_loras` adapters are too few for runs with these adapter counts in flight
    (`OrchestratorConfig.adapters_in_flight`), of which `slots` train at once; or None."""
    at_once = sorted(in_flight, reverse=True)[:slots]
    needed = sum(at_once)
    if max_loras >= needed:
        return None
    evaluating = sum(1 for count in at_once if count > 1)
    return (
        f"{max_loras} is fewer adapters than vLLM may have to serve at once: {len(at_once)} "
        f"runs train at once ({what} runs, {slots} trainer slots), each with its newest "
        f"adapter, and {evaluating} of them with an older one that an eval holds beside "
        f"training (eval.interval > 0): {needed} in flight. vLLM would queue some runs' "
        f"requests behind the others'; set max_loras to at least {needed}, {advice}"
    )


class RunChecker:
    """The checks of one run's config against a recipe; environments and prompt lengths are
    measured once for every run that shares them (a sweep's runs mostly do)."""

    def __init__(self, recipe: Recipe, tokenizer: Any | None):
        """`tokenizer`: the base model's (`prompt_tokenizer`); None skips prompt lengths."""
        self.recipe = recipe
        self.tokenizer = tokenizer
        self._longest: dict[tuple, int] = {}
        self._prompts: dict[tuple, list[Prompt]] = {}
        self._environments: dict[tuple[str, str], BuiltEnvironment] = {}

    def close(self) -> None:
        """End the environments it built (a verifiers environment's process)."""
        for env, _ in self._environments.values():
            if env is not None:
                env.close()

    def findings(self, config: OrchestratorConfig) -> list[Finding]:
        findings: list[Finding] = []
        rank = lora_rank_problem(config.lora.rank, self.recipe.trainer.lora.rank)
        if rank is not None:
            findings.append(("lora.rank", rank))
        served = self.recipe.max_lora_rank
        if rank is None and served is not None:
            run_rank = config.lora.rank or self.recipe.trainer.lora.rank
            problem = served_rank_problem(run_rank, served, whose="the run's adapters have")
            if problem is not None:
                findings.append(("lora.rank", problem))
        if config.lora.init_from is not None:
            trainer = self.recipe.trainer
            problem = init_adapter_problem(
                Path(config.lora.init_from),
                self.recipe.model.base,
                trainer.target_modules,
                config.lora.rank or trainer.lora.rank,
            )
            if problem is not None:
                findings.append(("lora.init_from", problem))
        env, problem = cached_environment(config, self._environments)
        if problem is not None:
            findings.append(problem)
            return findings
        if env is not None and config.eval.interval > 0:
            try:
                findings += self._eval_set_findings(config, env)
            except EnvironmentConfigError as err:  # nothing held out at all
                findings.append(("env_args", str(err)))
                return findings
        if env is not None and self.tokenizer is not None:
            try:
                findings += self._length_findings(config, env)
            except EnvironmentConfigError as err:  # too few training prompts to draw
                findings.append(("env_args", str(err)))
        return findings

    def _eval_set_findings(self, config: OrchestratorConfig, env: Environment) -> list[Finding]:
        """An eval whose prompts are mostly the same few: a task space too small to hold
        out 1 task in 16 for it (letter_count over two letters and words of 3)."""
        count = min(config.eval.num_prompts, MAX_PROMPTS_MEASURED)
        prompts = self._first_prompts(config, env, "eval", count)
        distinct = len({repr(prompt.messages) for prompt in prompts})
        if 2 * distinct >= count:
            return []
        return [
            (
                "env_args",
                f"the environment's task space holds out only {distinct} distinct prompt(s) "
                f"for evals, and an eval of {count} prompts would score them over and over: "
                "make the task space larger with env_args (longer texts or words, a larger "
                f"alphabet, more rows), set eval.num_prompts to at most {distinct}, or turn "
                "evals off with eval.interval = 0",
            )
        ]

    def _length_findings(self, config: OrchestratorConfig, env: Environment) -> list[Finding]:
        inference, trainer = self.recipe.inference, self.recipe.trainer
        total, measured = self._training_length(config, env)
        findings = []
        if total > inference.max_model_len:
            findings.append(
                (
                    "sampling.max_tokens",
                    f"{measured}; with max_tokens = {config.sampling.max_tokens} a request "
                    f"takes up to {total}, above [inference] max_model_len = "
                    f"{inference.max_model_len}, and vLLM would refuse it: raise max_model_len "
                    f"to {total} or lower max_tokens",
                )
            )
        if total > trainer.seq_len:
            findings.append(
                (
                    "sampling.max_tokens",
                    f"{measured}; with max_tokens = {config.sampling.max_tokens} a sample "
                    f"takes up to {total}, above [trainer] seq_len = {trainer.seq_len}, and the "
                    f"trainer would evict the run at its first such sample: raise seq_len to "
                    f"{total} or lower max_tokens",
                )
            )
        if config.eval.interval > 0:
            findings.extend(self._eval_length_findings(config, env, total))
        return findings

    def _training_length(self, config: OrchestratorConfig, env: Environment) -> tuple[int, str]:
        """The most tokens a training request of the run may take, and how it was measured."""
        count = min(max(TRAINING_PROMPTS_MEASURED, config.prompts_per_step), MAX_PROMPTS_MEASURED)
        if isinstance(env, MultiTurnEnvironment):
            # An episode holds every turn: the prompt and the environment's messages as the
            # template writes them, and up to max_tokens for each of the model's replies.
            prompt = self._longest_episode(config, env, count)
            return prompt + env.max_turns * config.sampling.max_tokens, (
                f"the longest of the run's first {count} training episodes has {prompt} tokens "
                f"of prompt and environment messages, and {env.max_turns} replies"
            )
        prompt = self._longest_prompt(config, env, "train", count)
        return prompt + config.sampling.max_tokens, (
            f"the longest of the run's first {count} training prompts is {prompt} tokens"
        )

    def _eval_length_findings(
        self, config: OrchestratorConfig, env: Environment, training_total: int
    ) -> list[Finding]:
        """An eval request above max_model_len, unless the training finding says it already."""
        max_model_len = self.recipe.inference.max_model_len
        eval_count = min(config.eval.num_prompts, MAX_PROMPTS_MEASURED)
        eval_prompt = self._longest_prompt(config, env, "eval", eval_count)
        eval_measured = (
            f"the longest of the run's {eval_count} eval prompts"
            if eval_count == config.eval.num_prompts
            else f"the longest of the first {eval_count} of the run's "
            f"{config.eval.num_prompts} eval prompts"
        )
        eval_tokens = config.eval.sampling.max_tokens or config.sampling.max_tokens
        eval_total = eval_prompt + eval_tokens
        # Said once: an eval no longer than training is covered by the training finding.
        if eval_total <= max_model_len or (
            eval_total <= training_total and training_total > max_model_len
        ):
            return []
        key = (
            "eval.sampling.max_tokens" if config.eval.sampling.max_tokens else "sampling.max_tokens"
        )
        return [
            (
                key,
                f"{eval_measured} is {eval_prompt} tokens; with {eval_tokens} to generate an eval request "
                f"takes up to {eval_total}, above [inference] max_model_len = "
                f"{max_model_len}: raise max_model_len to {eval_total} or "
                "lower the eval's max_tokens",
            )
        ]

    def _longest_prompt(
        self, config: OrchestratorConfig, env: Environment, split: str, count: int
    ) -> int:
        key = (*environment_key(config), config.seed, split, count)
        if key not in self._longest:
            prompts = self._first_prompts(config, env, split, count)
            self._longest[key] = max(self._prompt_tokens(p.messages) for p in prompts)
        return self._longest[key]

    def _first_prompts(
        self, config: OrchestratorConfig, env: Environment, split: str, count: int
    ) -> list[Prompt]:
        """The first `count` prompts of the run's `split` stream, drawn once for the eval-set
        and the length checks alike."""
        key = (*environment_key(config), config.seed, split, count)
        if key not in self._prompts:
            self._prompts[key] = env.sample_prompts(count, seed=config.seed, split=split)
        return self._prompts[key]

    def _longest_episode(
        self, config: OrchestratorConfig, env: MultiTurnEnvironment, count: int
    ) -> int:
        """The most template tokens an episode of the first `count` training prompts has
        besides its replies: each reply taken as empty, the environment answering it."""
        longest = 0
        for prompt in env.sample_prompts(count, seed=config.seed):
            chat, replies = list(prompt.messages), []
            for _ in range(env.max_turns):
                replies.append("")
                chat.append({"role": "assistant", "content": ""})
                message = env.respond(prompt, replies) if len(replies) < env.max_turns else None
                if message is None:
                    break
                chat.append({"role": "user", "content": message})
            ids = self.tokenizer.apply_chat_template(
                chat, add_generation_prompt=False, tokenize=True, return_dict=False
            )
            longest = max(longest, len(ids))
        return longest

    def _prompt_tokens(self, messages: list[dict[str, str]]) -> int:
        key = (self.recipe.model.base, json.dumps(messages, sort_keys=True, default=str))
        tokens = _PROMPT_TOKENS.get(key)
        if tokens is None:
            tokens = len(
                self.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True, return_dict=False
                )
            )
            _PROMPT_TOKENS[key] = tokens
            if len(_PROMPT_TOKENS) > PROMPT_TOKENS_REMEMBERED:
                _PROMPT_TOKENS.popitem(last=False)
        return tokens


def _tokenizer(base: str) -> tuple[Any | None, str | None]:
    """The base model's tokenizer (None for a hub model not cached), or why it fails."""
    try:
        return prompt_tokenizer(base), None
    except Exception as err:  # vLLM would fail on the same files
        return None, f"cannot load its tokenizer: {type(err).__name__}: {err}"


# Prompts' token counts as the model's chat template renders them, by (model, messages).
# Every add_run measures its run's first prompts, and a run added like the last one has
# the same prompts (its environment and seed): under the load of 48 runs on 2 cores,
# tokenizing them again took the supervisor's one thread seconds per add_run. Keyed by
# the prompt itself, so nothing goes stale; the oldest forgotten past the bound.
PROMPT_TOKENS_REMEMBERED = 4096
_PROMPT_TOKENS: OrderedDict[tuple[str, str], int] = OrderedDict()

# Each run's `adapters_in_flight`, derived again only when its orch.toml changes. The
# supervisor answers add_run on its one thread, and parsing every run's orch.toml
# (tomlkit: ~11 ms each) made an add_run beside 48 runs on a busy 2-core machine take
# 9-14 s, past the client's timeout. Per experiment, only its open runs' files: a run
# that closed or left is forgotten at the next add_run.
_IN_FLIGHT: dict[Path, dict[Path, OnFileChange[int | None]]] = {}


def _adapters_in_flight_of_open_runs(experiment: Path) -> list[int]:
    """`adapters_in_flight` of each of the experiment's runs that may still take a trainer
    slot; each orch.toml parsed once while it does not change."""
    known = _IN_FLIGHT.get(experiment, {})
    watched: dict[Path, OnFileChange[int | None]] = {}
    counts = []
    for run in layout.list_run_dirs(experiment):
        if run_control.run_condition(run).kind is not run_control.Condition.OPEN:
            continue
        path = layout.orch_config_path(run)
        watch = known.get(path) or OnFileChange(path, functools.partial(_in_flight_of, path))
        watched[path] = watch
        count = watch.get()
        if count is not None:  # else rejected at discovery: it takes no slot
            counts.append(count)
    _IN_FLIGHT[experiment] = watched
    return counts


def _in_flight_of(orch_config: Path) -> int | None:
    try:
        return load_orchestrator_config(orch_config).adapters_in_flight
    except (ConfigError, OSError):
        return None


class _KeyLocator:
    """Where in the recipe a run's problem comes from, so that its line is the one to edit:

    1. the run's `[[runs]]` table or the `[sweep]` key that sets the key itself;
    2. `[defaults]`, when the defaults alone have the same problem;
    3. else what the run changes made it: its `[[runs]]` table, or the first of its swept
       keys that has the problem when set alone over `[defaults]`, failing that `[sweep]`.

    It reads the runs the recipe's loader planned (`Recipe.planned_runs`): the sweep is not
    expanded again.
    """

    def __init__(self, recipe: Recipe, checker: RunChecker):
        planned = recipe.planned_runs
        self.tables = sum(1 for run in planned if run.source == "runs")
        self.values = {run.run_id: run.values for run in planned}
        self.defaults = recipe.defaults
        self.checker = checker
        self.default_keys = {key for key, _ in checker.findings(recipe.defaults)}
        self.params = []
        if recipe.sweep is not None:
            grid, sampled, _ = read_params(
                recipe.sweep.model_dump(mode="json"), recipe.defaults.model_dump(mode="json"), None
            )
            self.params = grid + sampled

    def loc(self, position: int, spec: RunSpec, key: str) -> tuple:
        parts = tuple(key.split("."))
        if position < self.tables:
            if _sets(spec.overrides, parts) or key not in self.default_keys:
                return ("runs", position, *parts)
            return ("defaults", *parts)
        swept = [param for param in self.params if param.key in self.values[spec.run_id]]
        for param in swept:
            if _overlaps(param.key, key):
                return param.loc
        if key in self.default_keys:
            return ("defaults", *parts)
        for param in swept:
            if key in self._keys_with(param.key, self.values[spec.run_id][param.key]):
                return param.loc
        return ("sweep",)

    def _keys_with(self, dotted: str, value: Any) -> set[str]:
        """The keys of the problems `[defaults]` has with `dotted` set to `value`."""
        merged = deep_merge(self.defaults.model_dump(mode="json"), nest_dotted(dotted, value))
        config = OrchestratorConfig.model_validate(merged)
        return {key for key, _ in self.checker.findings(config)}


def _sets(tree: dict[str, Any], parts: tuple[str, ...]) -> bool:
    """Whether a nested table sets the dotted key `parts` (or a table above it)."""
    node: Any = tree
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _overlaps(swept: str, key: str) -> bool:
    return swept == key or swept.startswith(key + ".") or key.startswith(swept + ".")
