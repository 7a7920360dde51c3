"""Whether a run's environment can be built with its `env_args` and hold out its eval
prompts: checked by preflight, and by a run's orchestrator before it waits for anything
(it trains with the environment it checked).
"""

from __future__ import annotations

import json

from workbench.config import OrchestratorConfig
from workbench.envs import Environment, EnvironmentConfigError, environment_class, get_environment

Finding = tuple[str, str]  # (dotted key of a run's config, what is wrong)


def environment_problem(config: OrchestratorConfig) -> Finding | None:
    """Why the run's environment cannot be built with its `env_args` (or hold out its eval
    prompts), as (key, message); None if it can."""
    env, problem = checked_environment(config)
    if env is not None:
        env.close()
    return problem


def checked_environment(config: OrchestratorConfig) -> BuiltEnvironment:
    """The run's environment, built and checked as `environment_problem` checks it, for the
    caller to use and close; or None and the finding (nothing it built is left open).

    An orchestrator trains with the environment it checked: a verifiers environment is a
    process of its own, and building it twice would start (and load the taskset) twice."""
    built: dict[tuple[str, str], BuiltEnvironment] = {}
    env, problem = cached_environment(config, built)
    if env is None:
        for other, _ in built.values():
            if other is not None:
                other.close()
    return env, problem


BuiltEnvironment = tuple[Environment | None, Finding | None]


def environment_key(config: OrchestratorConfig) -> tuple[str, str]:
    return config.env, json.dumps(config.env_args, sort_keys=True, default=str)


def cached_environment(
    config: OrchestratorConfig, built: dict[tuple[str, str], BuiltEnvironment]
) -> BuiltEnvironment:
    """The run's environment, or the finding that says why there is none; `built` keeps
    the environments built so far, by name and arguments."""
    key = environment_key(config)
    if key not in built:
        built[key] = _build_environment(config)
    env, problem = built[key]
    if problem is None and env is not None and config.eval.interval > 0:
        try:  # as the orchestrator's evaluator draws them, up front
            env.prompt(0, seed=config.seed, split="eval")
        except EnvironmentConfigError as err:
            return None, ("env_args", str(err))
    return env, problem


def _build_environment(config: OrchestratorConfig) -> BuiltEnvironment:
    try:
        environment_class(config.env)
    except EnvironmentConfigError as err:
        return None, ("env", str(err))
    try:
        return get_environment(config.env, **config.env_args), None
    except EnvironmentConfigError as err:
        return None, ("env_args", str(err))
