"""`python -m workbench.inference --config PATH`: start vLLM for an experiment.

Checks what can be checked before vLLM's slow start (vLLM installed,
`WORKBENCH_VLLM_CPU_LORA`, port free, model directory, enough free memory on a CPU
machine), then replaces this process with vLLM's server so signals from the supervisor
reach it directly. The port comes from the config (or, with --move-port-if-taken, from
`supervisor/endpoint.json`, rewritten when the port was taken meanwhile); the API key from
`supervisor/endpoint.json`.

Exit status: 2 a setup that a restart cannot fix, 1 too little free memory (a restart may
find more), otherwise vLLM's own.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from workbench.config import ConfigError, load_inference_config
from workbench.files.endpoint import read_endpoint
from workbench.inference.server import (
    InferenceSetupError,
    NotEnoughMemory,
    build_vllm_command,
    check_cpu_lora_kernel,
    check_cpu_memory,
    check_model_dir,
    check_vllm_installed,
    server_environment,
    serving_port,
)
from workbench.system.lifeline import die_with_parent
from workbench.system.priority import run_as_batch


def main(argv: list[str] | None = None) -> int:
    die_with_parent()  # survives the execve below: vLLM stops when the supervisor dies
    run_as_batch()  # so does the nice value, and the session's
    parser = argparse.ArgumentParser(prog="python -m workbench.inference", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="an InferenceConfig TOML")
    parser.add_argument(
        "--move-port-if-taken",
        action="store_true",
        help="serve on a new free port (written to endpoint.json) if the planned one is taken",
    )
    args = parser.parse_args(argv)
    try:
        config = load_inference_config(args.config)
        endpoint = read_endpoint(config.output_dir)
        if endpoint is None:
            raise InferenceSetupError(
                f"{config.output_dir}/supervisor/endpoint.json is missing; it holds the API key "
                "(start inference through `workbench up`)"
            )
        if config.inference.port == 0:
            raise InferenceSetupError(f"{args.config}: [inference] port must be set (not 0) here")
        check_vllm_installed()
        check_cpu_lora_kernel()
        port = serving_port(config, endpoint, may_move=args.move_port_if_taken)
        from workbench.models.build_progress import BuildProgressFile
        from workbench.models.resolve import resolve_model

        # Removed before vLLM replaces this process: the build is over once it runs.
        with BuildProgressFile(config.output_dir, config.model.base) as on_step:
            model = resolve_model(config.model.base, on_step=on_step)
        check_model_dir(model)
        check_cpu_memory(model)
    except NotEnoughMemory as err:
        print(f"error: {err}", file=sys.stderr)
        return 1  # memory may free up: the supervisor tries again with backoff
    except (ConfigError, InferenceSetupError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    command = build_vllm_command(config, model, port)
    print("starting:", shlex.join(command), file=sys.stderr, flush=True)  # as a shell reads it
    os.execve(sys.executable, command, server_environment(endpoint.api_key))
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
