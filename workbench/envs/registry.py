"""Finding an environment by name: the built-ins, registered ones, `verifiers:<taskset id>`
(an environment written with verifiers, run in a process of its own: `verifiers_env`), or
`package.module:Class`.

`get_environment(name, **env_args)` is what orchestrators and `workbench sft` call with a run's
`env` and `env_args`; every mistake raises `EnvironmentConfigError` naming the environment,
the argument and what is allowed.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from workbench.config.user_code import import_user_module, not_found_hint
from workbench.envs.base import Environment, EnvironmentConfigError
from workbench.envs.dataset import DatasetEnvironment
from workbench.envs.letter_count import LetterCount
from workbench.envs.reverse_chain import ReverseChain
from workbench.envs.reverse_text import ReverseText
from workbench.envs.verifiers_env import PREFIX as VERIFIERS_PREFIX
from workbench.envs.verifiers_env import verifiers_environment_class

_REGISTRY: dict[str, type[Environment]] = {}


def register_environment(env_class: type[Environment]) -> type[Environment]:
    """Make `env_class` available under its `name` (usable as a class decorator)."""
    existing = _REGISTRY.get(env_class.name)
    if existing is not None and existing is not env_class:
        raise EnvironmentConfigError(
            f"environment name {env_class.name!r} is already taken by "
            f"{existing.__module__}.{existing.__qualname__}"
        )
    _REGISTRY[env_class.name] = env_class
    return env_class


def environment_names() -> list[str]:
    return sorted(_REGISTRY)


def get_environment(name: str, **env_args: Any) -> Environment:
    """The environment called `name`, configured by `env_args`.

    `name` is a registered name (`reverse_text`, `letter_count`, ...), `verifiers:<taskset
    id>` for a verifiers environment, or an import path `package.module:ClassName` of an
    `Environment` subclass, for environments that live outside this package.
    """
    env_class = environment_class(name)
    try:
        args = env_class.Args.model_validate(env_args)
    except ValidationError as err:
        problems = []
        for item in err.errors():
            key = ".".join(str(part) for part in item["loc"])
            if item["type"] == "extra_forbidden":
                allowed = ", ".join(sorted(env_class.Args.model_fields))
                problems.append(f"unknown env_args key {key!r} (allowed: {allowed})")
            else:
                where = f"env_args.{key}: " if key else "env_args: "
                problems.append(where + item["msg"].removeprefix("Value error, "))
        raise EnvironmentConfigError(f"environment {name!r}: " + "; ".join(problems)) from None
    return env_class(args)


def environment_class(name: str) -> type[Environment]:
    """The class `name` stands for; `EnvironmentConfigError` if none (its `env_args` aside)."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name.startswith(VERIFIERS_PREFIX):
        return verifiers_environment_class(name.removeprefix(VERIFIERS_PREFIX))
    if ":" in name:
        return _import_environment(name)
    raise EnvironmentConfigError(
        f"unknown environment {name!r}; built in: {', '.join(environment_names())} "
        f"(or {VERIFIERS_PREFIX}<taskset id> for a verifiers environment, or an import path, "
        "package.module:ClassName)"
    )


def _import_environment(path: str) -> type[Environment]:
    module_name, _, attribute = path.partition(":")
    try:
        module = import_user_module(module_name)
    except Exception as err:  # an import error, or any error the module raises as it loads
        raise EnvironmentConfigError(
            f"environment {path!r}: cannot import module {module_name!r} ({err}); "
            + not_found_hint()
        ) from None
    env_class = getattr(module, attribute, None)
    if not (isinstance(env_class, type) and issubclass(env_class, Environment)):
        raise EnvironmentConfigError(
            f"environment {path!r}: {attribute!r} in {module_name} is not an Environment subclass"
        )
    return env_class


register_environment(ReverseText)
register_environment(LetterCount)
register_environment(DatasetEnvironment)
register_environment(ReverseChain)
