"""The recipe's `[inference]` section, and the config the supervisor hands vLLM."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from workbench.config.base import ModelSection, StrictModel
from workbench.config.loading import read_toml, validate_model
from workbench.config.trainer import TrainerSection

# The most adapter versions one run has in flight (`OrchestratorConfig.adapters_in_flight`).
MAX_ADAPTERS_IN_FLIGHT = 2


def default_max_loras(max_concurrent_runs: int) -> int:
    """`[inference] max_loras` when the recipe leaves it out: room for every trainer slot."""
    return max_concurrent_runs * MAX_ADAPTERS_IN_FLIGHT


# vLLM's engine batch on a CPU with `max_num_seqs = "auto"`. vLLM's CPU defaults (128
# sequences, 2,048 tokens) are one run's batch of the built-in recipe: with 16 runs (8
# steps, on the 2-core machine) a step's generation took a median 7.7 s with these against
# 11.2 s with the defaults, the experiment 122 s against 165 s (docs/benchmarks/many-runs.md).
CPU_BATCH_SEQS = 1024
CPU_BATCH_TOKENS = 16384

# The adapter ranks vLLM's server takes for --max-lora-rank (`MaxLoRARanks` in
# vllm/config/lora.py, argparse choices): any other value stops it at startup.
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def served_lora_rank(rank: int) -> int | None:
    """The smallest --max-lora-rank vLLM takes that serves adapters of `rank`; None when
    `rank` is above every one."""
    return next((served for served in VLLM_MAX_LORA_RANKS if served >= rank), None)


def served_rank_problem(rank: int, served: int | None, *, whose: str) -> str | None:
    """Why vLLM, started with --max-lora-rank `served` (None: no value serves `rank`), could
    not load adapters of `rank`; or None."""
    if served is None:
        return (
            f"{whose} rank {rank}, above {VLLM_MAX_LORA_RANKS[-1]}, the largest adapter rank "
            "vLLM serves; lower it"
        )
    if rank <= served:
        return None
    return (
        f"{whose} rank {rank}, above [inference] max_lora_rank = {served}: vLLM would refuse "
        f"to load them; raise max_lora_rank to {served_lora_rank(rank)} or lower the rank"
    )


class InferenceSection(StrictModel):
    host: str = Field(
        "127.0.0.1",
        description="the address vLLM binds, loopback by default; requests need the "
        "experiment's random API key",
    )
    port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    max_loras: int | None = Field(
        None,
        ge=1,
        description="adapters vLLM serves at once: a training run needs its newest adapter, "
        "and an older one while an eval of it runs beside training. Default: "
        "`max_concurrent_runs` x 2, enough for every trainer slot",
    )
    max_lora_rank: int | None = Field(
        None,
        ge=1,
        description="the largest adapter rank vLLM serves: one of "
        f"{', '.join(map(str, VLLM_MAX_LORA_RANKS))} (vLLM takes no other); default: the "
        "smallest of those at least the trainer's rank",
    )
    max_model_len: int = Field(
        512, ge=16, description="longest prompt plus completion vLLM accepts, in tokens"
    )
    gpus: list[int] = Field(
        default_factory=list,
        description="CUDA device ids for vLLM, tensor_parallel_size x data_parallel_size of "
        "them; empty: the first that many; ignored on a machine without GPUs",
    )
    tensor_parallel_size: int = Field(
        1, ge=1, description="GPUs one copy of the model spans (vLLM's --tensor-parallel-size)"
    )
    data_parallel_size: int = Field(
        1,
        ge=1,
        description="copies of the model vLLM serves from, each on tensor_parallel_size GPUs "
        "(vLLM's --data-parallel-size)",
    )
    gpu_memory_utilization: float = Field(
        0.45,
        gt=0,
        le=1,
        description="the fraction of GPU memory vLLM may take; lower it when the trainer "
        "shares the GPU",
    )
    dtype: str = Field(
        "auto", description="`auto`: the trainer's dtype, so log-probs agree with the trainer's"
    )
    startup_timeout_s: float = Field(
        600.0, gt=0, description="give up, quoting vLLM's log, if not ready by then"
    )

    @field_validator("max_lora_rank")
    @classmethod
    def _a_rank_vllm_takes(cls, rank: int | None) -> int | None:
        if rank is not None and rank not in VLLM_MAX_LORA_RANKS:
            raise ValueError(
                f"vLLM takes a max_lora_rank of {', '.join(map(str, VLLM_MAX_LORA_RANKS))} "
                f"only, and would not start with {rank}; use {served_lora_rank(rank) or 512}, "
                "or leave it out"
            )
        return rank

    max_num_seqs: int | Literal["auto"] = Field(
        "auto",
        description="the most sequences vLLM decodes in one engine step (its --max-num-seqs). "
        f"auto: on a CPU {CPU_BATCH_SEQS} (vLLM's CPU default, 128, is one run's batch: "
        "with many runs the engine's per-step cost, not the arithmetic, bounds generation); "
        "on a GPU vLLM's own default",
    )
    max_num_batched_tokens: int | Literal["auto"] = Field(
        "auto",
        description="the most tokens of one engine step (vLLM's --max-num-batched-tokens), "
        f"at least max_num_seqs. auto: on a CPU {CPU_BATCH_TOKENS} (vLLM's CPU default: "
        "2048); on a GPU vLLM's own default",
    )

    @field_validator("max_num_seqs", "max_num_batched_tokens")
    @classmethod
    def _positive(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError('must be at least 1, or "auto"')
        return value

    @model_validator(mode="after")
    def _a_step_holds_its_sequences(self) -> InferenceSection:
        seqs, tokens = self.max_num_seqs, self.max_num_batched_tokens
        if isinstance(seqs, int) and isinstance(tokens, int) and tokens < seqs:
            raise ValueError(
                f"max_num_batched_tokens = {tokens} is below max_num_seqs = {seqs}: vLLM "
                "would not start; raise it or lower max_num_seqs"
            )
        return self

    extra_args: list[str] = Field(
        default_factory=list,
        description=(
            "passed to vLLM's server as they are, after workbench's own flags (vLLM takes "
            "the last of a flag given twice). On a CPU workbench turns vLLM's C++ kernels "
            'on (--compilation-config \'{"custom_ops": ["all"]}\') unless these set '
            "-O, -cc or --compilation-config"
        ),
    )


class InferenceConfig(StrictModel):
    """What `python -m workbench.inference --config` reads (written by the supervisor)."""

    output_dir: Path = Field(description="the experiment directory")
    model: ModelSection = Field(description="the base model vLLM serves")
    inference: InferenceSection = Field(
        default_factory=InferenceSection,
        description="the recipe's [inference], with the port set (the supervisor picks one for 0)",
    )
    max_lora_rank: int = Field(
        8, ge=1, description="the largest adapter rank vLLM accepts (the trainer's by default)"
    )

    @property
    def max_loras(self) -> int:
        """The supervisor writes the recipe's value; a file written by hand without it gets
        the default for the default trainer slots."""
        slots = TrainerSection.model_fields["max_concurrent_runs"].default
        return self.inference.max_loras or default_max_loras(slots)


def load_inference_config(path: Path) -> InferenceConfig:
    document, text = read_toml(path)
    return validate_model(InferenceConfig, document.unwrap(), path, text)
