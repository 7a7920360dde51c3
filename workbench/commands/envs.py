"""`workbench env install verifiers`: the venv that verifiers environments run in
(`workbench.envs.verifiers_venv`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from workbench.commands.common import EXIT_BAD_INPUT, command_group, fail, say

env_app = command_group("env", "What environments need outside workbench's own venv.")

KINDS = ("verifiers",)


@env_app.command("install")
def env_install(
    kind: Annotated[str, typer.Argument(help="What to install: verifiers.")],
    python: Annotated[
        str | None,
        typer.Option(
            "--python",
            help="The interpreter to make the venv from (3.11 or newer); default the one "
            "running workbench.",
        ),
    ] = None,
    with_: Annotated[
        list[str] | None,
        typer.Option(
            "--with",
            help="A pip requirement to install beside verifiers: an environment's package, "
            "by name or by the path of its folder. Repeatable; remembered, so a later "
            "install keeps it.",
        ),
    ] = None,
) -> None:
    """Make the venv `verifiers:<taskset id>` environments run in, or add packages to it.

    verifiers pins an openai release vLLM cannot share a venv with, so its environments
    run in a process of their own, from this venv: $WORKBENCH_VERIFIERS_VENV, else
    $WORKBENCH_CACHE_DIR/envs/verifiers (~/.cache/workbench/envs/verifiers on Linux). It
    holds verifiers, uv (verifiers runs each episode's harness program as a uv script,
    prepared here once) and the packages given with --with. Needs the package registry.
    """
    from workbench.envs import verifiers_venv

    if kind not in KINDS:
        raise fail(f"unknown kind {kind!r}; one of: {', '.join(KINDS)}", EXIT_BAD_INPUT)
    requirements = [str(Path(r).resolve()) if Path(r).exists() else r for r in with_ or []]
    try:
        venv = verifiers_venv.install(python=python, requirements=requirements, say=say)
    except verifiers_venv.InstallError as err:
        raise fail(str(err)) from None
    marker = verifiers_venv.installed(venv) or {}
    say(f"verifiers {marker.get('verifiers', '?')} in {venv}")
    for package in marker.get("with", []):
        say(f"  with {package}")
