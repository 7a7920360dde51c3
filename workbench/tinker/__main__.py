"""The Tinker service process: `python -m workbench.tinker EXPERIMENT --port N`; the API key
comes from the environment (WORKBENCH_TINKER_API_KEY), never from the command line, which
other users can read."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import uvicorn

from workbench.files import layout
from workbench.models.resolve import loadable_base
from workbench.recipe import load_recipe
from workbench.system.lifeline import die_with_parent
from workbench.tinker.app import create_app
from workbench.tinker.http import ServiceSettings

API_KEY_ENV = "WORKBENCH_TINKER_API_KEY"


def settings_for(experiment: Path, api_key: str, session_timeout_s: float) -> ServiceSettings:
    """What the service serves, from the experiment's recipe: its base model (named as the
    recipe names it), the tokenizer's directory and the trainer's LoRA rank."""
    recipe = load_recipe(layout.recipe_path(experiment))
    return ServiceSettings(
        experiment=experiment,
        api_key=api_key,
        base_model=recipe.model.base,
        tokenizer_dir=loadable_base(recipe.model.base),
        trainer_rank=recipe.trainer.lora.rank,
        session_timeout_s=session_timeout_s,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.tinker")
    parser.add_argument("experiment", type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8780)
    parser.add_argument("--session-timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    die_with_parent()  # a SIGTERM when the supervisor dies, as on `workbench down`
    api_key = os.environ.get(API_KEY_ENV)
    if not api_key:
        print(
            f"{API_KEY_ENV} is not set: the service never runs without an API key", file=sys.stderr
        )
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = settings_for(args.experiment.resolve(), api_key, args.session_timeout)
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
