"""Pluggable environments: a seeded prompt dataset, a system prompt, an answer parser and a
reward in [0, 1]. Built in: `reverse_text` (the default task), `letter_count`, `dataset` (a
local data file) and `reverse_chain` (multi-turn: `MultiTurnEnvironment`).

    env = get_environment("reverse_text", min_length=6, max_length=12)
    prompts = env.sample_prompts(8, seed=0, start=position)   # resumable: position is an int
    reward = env.reward(prompts[0], completion_text)

A verifiers environment runs in a process of its own (`verifiers_env`, `verifiers_server`,
`verifiers_chat`, `verifiers_speedups`, `verifiers_venv`) and produces its episodes itself
(`external.ExternalEpisodes`). `episode`
holds `Episode`, what every environment's episodes are made of; `checks` builds a run's
environment once and says why it cannot be built, for preflight and the orchestrator.

`base` is the interface; `registry` finds an environment by name; `multi_turn` the
several-turn kind; `splits` which tasks are held out; `answers` pulls an answer out of a
completion and compares it; `data_files` reads JSON Lines, CSV or Parquet for `dataset`;
`verifiers_versions` the verifiers releases that process was tested against.
"""

from workbench.envs.base import (
    EnvArgs,
    Environment,
    EnvironmentConfigError,
    Prompt,
    PromptDataset,
    Task,
)
from workbench.envs.multi_turn import MultiTurnEnvironment
from workbench.envs.registry import (
    environment_class,
    environment_names,
    get_environment,
    register_environment,
)

__all__ = [
    "EnvArgs",
    "Environment",
    "EnvironmentConfigError",
    "MultiTurnEnvironment",
    "Prompt",
    "PromptDataset",
    "Task",
    "environment_class",
    "environment_names",
    "get_environment",
    "register_environment",
]
