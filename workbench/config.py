"""Pydantic models of the recipe's sections and of every process's config; tomlkit I/O.

Every TOML file of the project is read here (`read_toml`). Bad input raises `ConfigError`, whose
message names the file, the key and, where the source gives it, the line, and says what to
do. Nothing here touches a process: the supervisor, trainer and orchestrators import it.

- The sections a recipe is made of (`ExperimentSection`, `ModelSection`,
  `InferenceSection`, `TrainerSection`, `TrackingSection`); the recipe itself, its
  `[[runs]]` and its `[sweep]` are assembled in `workbench.recipe`.
- `OrchestratorConfig`: one run's `control/orch.toml`, and the recipe's `[defaults]`. Every
  field has a default, so an empty file is a valid run that takes all defaults.
- `TrainerConfig`, `InferenceConfig`: what the supervisor hands the trainer and vLLM.
- Run ids, and the error plumbing every loader shares (`problem_at`, `explain_error`).
"""

from __future__ import annotations

import copy
import difflib
import importlib.util
import re
import sys
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import tomlkit
import tomlkit.exceptions
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from workbench.files import layout

# ------------------------------------------------------------------------- errors


class ConfigProblem(BaseModel):
    """One thing wrong with a config file."""

    key: str
    message: str
    line: int | None = None

    def render(self, path: Path | str | None) -> str:
        where = str(path) if path else "<config>"
        if self.line is not None:
            where += f", line {self.line}"
        key = f" {self.key}:" if self.key else ""
        return f"{where}:{key} {self.message}"


class ConfigError(ValueError):
    """A config file (or text) is invalid; `str()` lists every problem once, one per line
    (the runs that share a `[defaults]` key share its problem)."""

    def __init__(self, path: Path | str | None, problems: list[ConfigProblem]):
        self.path = path
        self.problems = _dedupe(problems)
        super().__init__("\n".join(p.render(path) for p in self.problems))


# ------------------------------------------------------------------------- models


# Attention and MLP projections of the Llama, Qwen2/2.5/3 and Mistral families.
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class StrictModel(BaseModel):
    """Unknown keys are errors: a typo must not silently fall back to a default. No float
    setting takes inf or nan (TOML spells them `inf`, `nan`): a learning rate, a clip norm or
    a timeout of either is a mistake that would surface only once the runs are going."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class LoraConfig(StrictModel):
    rank: int = Field(
        8,
        ge=1,
        description="LoRA rank r; in `[trainer]` the rank of every adapter slot, the most a "
        "run may ask for",
    )
    alpha: float = Field(16.0, gt=0, description="LoRA alpha; the update is scaled by alpha / rank")


class RunLoraConfig(StrictModel):
    """A run may ask for a smaller rank than the trainer's slots; None takes the trainer's."""

    rank: int | None = Field(
        None, ge=1, description="this run's LoRA rank, at most the trainer's; unset: the trainer's"
    )
    alpha: float | None = Field(
        None, gt=0, description="this run's LoRA alpha; unset: the trainer's"
    )


GREEDY_TRAINING = (
    "0 is greedy decoding: every completion of a prompt would be the same text, so every "
    "advantage (its reward minus its group's mean) is 0 and the run learns nothing; use a "
    "temperature above 0 (greedy is for evals: eval.sampling.temperature = 0)"
)


GROUP_OF_ONE = (
    "1 makes groups of one completion: a completion's advantage is its reward minus its "
    "group's mean, so every advantage is 0 and the run learns nothing; use 2 or more "
    "(a single eval completion per prompt is eval.rollouts_per_prompt = 1, its default)"
)


class SamplingConfig(StrictModel):
    temperature: float = Field(
        1.0,
        gt=0,
        description="sampling temperature; the trainer scales its log-probs by the same one. "
        "Not 0: greedy completions of a prompt are all alike, so nothing is learnt",
    )
    top_p: float = Field(
        1.0,
        gt=0,
        le=1,
        description="nucleus sampling: draw from the most likely tokens that make up this "
        "much probability; 1 keeps them all",
    )
    max_tokens: int = Field(64, ge=1, description="completion length limit, in tokens")

    @field_validator("temperature", mode="before")
    @classmethod
    def _not_greedy(cls, value: Any) -> Any:
        if isinstance(value, int | float) and not isinstance(value, bool) and value == 0:
            raise ValueError(GREEDY_TRAINING)
        return value


class EvalSamplingConfig(StrictModel):
    """How eval completions are sampled; greedy by default, so scores move with the policy
    rather than with sampling noise."""

    temperature: float = Field(
        0.0, ge=0, description="0 is greedy decoding, and then takes `rollouts_per_prompt = 1`"
    )
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling, as in `sampling.top_p`")
    max_tokens: int | None = Field(
        None, ge=1, description="default: the run's `sampling.max_tokens`"
    )


# An eval scores all its prompts at every interval, beside training. 4096 prompts already
# estimate a mean reward in [0, 1] within about +-0.016 (95 %); a million would stall a
# run on its first eval for hours.
MAX_EVAL_PROMPTS = 4096


class EvalConfig(StrictModel):
    """Scoring each new policy version on the environment's held-out prompts."""

    interval: int = Field(
        10,
        ge=0,
        description="score every N policy versions from the base model (version 0), and the "
        "run's last version; 0 disables evals",
    )
    num_prompts: int = Field(
        32,
        ge=1,
        description="held-out prompts, the same ones every time (never used in training); at "
        f"most {MAX_EVAL_PROMPTS}",
    )
    rollouts_per_prompt: int = Field(
        1, ge=1, description="completions per prompt; more than 1 needs a temperature above 0"
    )
    sampling: EvalSamplingConfig = Field(
        default_factory=EvalSamplingConfig,
        description="how eval completions are sampled: greedy by default, so scores move with "
        "the policy rather than with sampling noise",
    )

    @field_validator("num_prompts")
    @classmethod
    def _an_eval_that_ends(cls, value: int) -> int:
        if value > MAX_EVAL_PROMPTS:
            raise ValueError(
                f"{value} prompts scored at every eval interval would hold the run up for "
                f"longer than it trains: use at most {MAX_EVAL_PROMPTS}, which estimate a mean "
                "reward in [0, 1] within about +-0.016"
            )
        return value

    @model_validator(mode="after")
    def _greedy_takes_one_rollout(self) -> EvalConfig:
        if self.sampling.temperature == 0 and self.rollouts_per_prompt > 1:
            raise ValueError(
                f"rollouts_per_prompt = {self.rollouts_per_prompt} with sampling.temperature = 0 "
                "asks for the same greedy completion again: use 1 rollout, or a temperature > 0"
            )
        return self


class OptimizerConfig(StrictModel):
    weight_decay: float = Field(0.0, ge=0, description="AdamW's decoupled weight decay")
    betas: tuple[float, float] = Field(
        (0.9, 0.999), description="AdamW's (beta1, beta2), each in [0, 1)"
    )
    eps: float = Field(
        1e-8,
        gt=0,
        description="AdamW's epsilon; above 0, since an adapter's first gradients may be 0 "
        "(its B matrix starts at 0) and 0 / 0 is nan",
    )
    max_norm: float = Field(
        1.0,
        gt=0,
        description="gradient clipping norm; each run is clipped by its own norm, so one "
        "run's large loss cannot shrink another's update",
    )

    @field_validator("betas")
    @classmethod
    def _betas_adamw_takes(cls, betas: tuple[float, float]) -> tuple[float, float]:
        # torch's AdamW refuses a beta outside [0, 1) (torch/optim/adam.py) when the
        # trainer makes the run's optimizer, after launch: said here instead.
        for number, beta in enumerate(betas, start=1):
            if not 0 <= beta < 1:
                raise ValueError(
                    f"beta{number} = {beta:g} is outside [0, 1), where AdamW takes it: each "
                    "beta is the weight of the old average in a running average (of gradients, "
                    "then of their squares), e.g. [0.9, 0.999]"
                )
        return betas


class SchedulerConfig(StrictModel):
    kind: Literal["constant", "linear", "cosine"] = Field(
        "constant",
        description="after warm-up: stay at `lr` (constant), or decay from `lr` to "
        "`min_lr_ratio * lr` (linear, cosine), reached one update past `max_steps`",
    )
    warmup_steps: int = Field(
        0, ge=0, description="updates over which `lr` rises linearly (the first at `lr / N`)"
    )
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="where linear and cosine decay end, as a fraction of `lr`"
    )


class LossConfig(StrictModel):
    """Importance-ratio policy loss with token masking and a small KL-style penalty."""

    mask_ratio_low: float = Field(
        0.125,
        gt=0,
        lt=1,
        description="mask a token of negative advantage whose importance ratio (trainer / "
        "inference probability) fell below this; below 1, the ratio of an unchanged policy",
    )
    mask_ratio_high: float = Field(
        8.0,
        gt=1,
        description="mask a token of positive advantage whose importance ratio rose above this",
    )
    mask_both_sides: bool = Field(
        False, description="mask outside the band whatever the advantage's sign (prime-rl)"
    )
    kl_coef: float = Field(
        1e-3,
        ge=0,
        description="weight of the penalty (log ratio)^2 / 2 that keeps the policy near the "
        "one that sampled",
    )


class OrchestratorConfig(StrictModel):
    """One run's `control/orch.toml`. Every field has a default: an empty file is valid."""

    env: str = Field(
        "reverse_text",
        description="environment: a built-in name (`reverse_text`, `letter_count`, `dataset` for a data file, `reverse_chain` multi-turn), "
        "`verifiers:<taskset id>` (a verifiers environment) or `package.module:ClassName`",
    )
    env_args: dict[str, Any] = Field(
        default_factory=dict,
        description="the environment's arguments (see `env_args` of each environment below)",
    )
    max_steps: int = Field(30, ge=1, description="training steps; the run finishes after the last")
    batch_size: int = Field(
        64, ge=1, description="completions per step, a multiple of `rollouts_per_prompt`"
    )
    rollouts_per_prompt: int = Field(
        8,
        ge=1,
        description="completions of each prompt; a completion's advantage is its reward "
        "minus its group's mean. At least 2: a group of one has an advantage of 0, so "
        "nothing is learnt",
    )
    lr: float = Field(3e-4, gt=0, description="the run's learning rate (the schedule's peak)")
    async_level: int = Field(
        1,
        ge=0,
        description="steps the orchestrator may run ahead of its adapter: step n may sample "
        "with any version >= `n - async_level`",
    )
    seed: int = Field(
        0,
        description="seeds the run's prompt order, sampling seeds, eval prompts and the "
        "adapter's initial weights",
    )
    checkpoint_interval: int = Field(
        10,
        ge=0,
        description="trainer checkpoint every N steps, besides the last step, shutdown and "
        "leaving the trainer; 0: only those",
    )
    lora: RunLoraConfig = Field(
        default_factory=RunLoraConfig,
        description="this run's adapter: rank at most the trainer's `lora.rank`",
    )
    sampling: SamplingConfig = Field(
        default_factory=SamplingConfig, description="how training completions are sampled"
    )
    optim: OptimizerConfig = Field(
        default_factory=OptimizerConfig, description="the run's own AdamW"
    )
    scheduler: SchedulerConfig = Field(
        default_factory=SchedulerConfig, description="the run's learning-rate schedule"
    )
    loss: LossConfig = Field(
        default_factory=LossConfig,
        description="the policy loss: masked importance sampling with a small KL-style penalty",
    )
    eval: EvalConfig = Field(
        default_factory=EvalConfig,
        description="scoring the policy on the environment's held-out prompts",
    )

    @field_validator("rollouts_per_prompt", mode="before")
    @classmethod
    def _groups_of_two_or_more(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and value == 1:
            raise ValueError(GROUP_OF_ONE)
        return value

    @model_validator(mode="after")
    def _batch_holds_whole_groups(self) -> OrchestratorConfig:
        if self.batch_size % self.rollouts_per_prompt:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of rollouts_per_prompt "
                f"({self.rollouts_per_prompt}): a step trains whole groups of one prompt"
            )
        return self

    @property
    def prompts_per_step(self) -> int:
        return self.batch_size // self.rollouts_per_prompt

    @property
    def adapters_in_flight(self) -> int:
        """Adapter versions of this run that vLLM may serve at once: the newest, which every
        step generates with (a step samples one version; `async_level` lets it be older, not
        several), and the one an eval holds while it runs beside training."""
        return 2 if self.eval.interval > 0 else 1


# The most adapter versions one run has in flight (`OrchestratorConfig.adapters_in_flight`).
MAX_ADAPTERS_IN_FLIGHT = 2


def default_max_loras(max_concurrent_runs: int) -> int:
    """`[inference] max_loras` when the recipe leaves it out: room for every trainer slot."""
    return max_concurrent_runs * MAX_ADAPTERS_IN_FLIGHT


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


def lora_rank_problem(run_rank: int | None, trainer_rank: int) -> str | None:
    """Why a run's `lora.rank` cannot have a trainer slot of `trainer_rank`, or None."""
    if run_rank is None or run_rank <= trainer_rank:
        return None
    return (
        f"rank {run_rank} is larger than the trainer's adapter slots ([trainer] lora.rank = "
        f"{trainer_rank}); raise that or ask for at most {trainer_rank}"
    )


class ExperimentSection(StrictModel):
    name: str = Field("experiment", description="the experiment's name")
    output_dir: Path | None = Field(
        None, description="the experiment directory; default: `outputs/<name>`"
    )


class ModelSection(StrictModel):
    base: str = Field(
        description="`builtin:tiny-reverse` (or `builtin:tiny-reverse-chat`), a local model "
        "directory or a hub id"
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

    extra_args: list[str] = Field(
        default_factory=list, description="passed to vLLM's server as they are"
    )


# An idle trainer sleeps this long at most between looks for runs and batches.
MAX_POLL_INTERVAL_S = 60.0


# The trainer's attention paths that run rows whose samples share prompts (`share_prompts`;
# `workbench.trainer.attention.packed_attention` refuses such rows on the others).
PROMPT_SHARING_ATTENTION = ("per_sample", "dense")


class TrainerSection(StrictModel):
    max_concurrent_runs: int = Field(
        4, ge=1, description="adapter slots; extra runs wait for a free slot"
    )
    lora: LoraConfig = Field(
        default_factory=LoraConfig,
        description="rank and alpha of every adapter slot; a run may ask for a smaller rank",
    )
    target_modules: list[str] = Field(
        default_factory=lambda: list(LORA_TARGET_MODULES),
        min_length=1,
        description="the linear layers that get adapters, by the last part of their name; "
        "each must name linear layers of the base model (the default: those of it that it "
        "names)",
    )
    gpus: list[int] = Field(
        default_factory=list,
        description="CUDA device ids for the trainer's ranks; empty: those inference leaves "
        "(shared when too few); ignored on a machine without GPUs",
    )
    nproc_per_node: int = Field(1, ge=1, description="trainer ranks (data parallel) per node")
    base_sharding: Literal["auto", "sharded", "replicated"] = Field(
        "auto",
        description="how the frozen base lies over the trainer's ranks: `sharded` splits "
        "each decoder layer, the embeddings and the LM head over them with FSDP2 (each rank "
        "holds 1/ranks of the base and gathers a layer as it runs), `replicated` keeps a "
        "whole copy on every rank; `auto`: sharded with more than one rank. Adapters are "
        "replicated either way",
    )
    nnodes: int = Field(
        1,
        ge=1,
        description="machines the trainer's ranks span: the one `workbench up` runs on (node "
        "0) and nnodes - 1 more, each started with `workbench join EXPERIMENT --node-rank K` "
        "and running nproc_per_node ranks; the experiment directory must be on a filesystem "
        "they share, at the same path",
    )
    rendezvous_interface: str | None = Field(
        None,
        min_length=1,
        description="network interface of node 0 (e.g. eth0) whose IPv4 address its "
        "rendezvous store listens on and gloo's and nccl's sockets bind, so other nodes can "
        "join; none: the loopback interface (127.0.0.1) only, where all nodes are this "
        "machine",
    )
    rendezvous_port: int = Field(
        0,
        ge=0,
        le=65535,
        validate_default=True,
        description="port of node 0's rendezvous store; 0 picks a free one, with one node "
        "only: the other nodes must know it",
    )
    seq_len: int = Field(512, ge=16, description="tokens per packed micro-batch row")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description="the frozen base model's precision; LoRA adapters and their AdamW state "
        "stay float32 whatever it is (as peft keeps them), and the LoRA matmuls run in it",
    )
    poll_interval_s: float = Field(
        0.2,
        gt=0,
        le=MAX_POLL_INTERVAL_S,
        description="how often an idle trainer looks for runs and batches, in seconds; at "
        f"most {MAX_POLL_INTERVAL_S:g}, since a new run or batch waits up to that long",
    )
    attention: Literal["auto", "per_sample", "varlen", "flash", "flex", "dense"] = Field(
        "auto",
        description="how packed rows attend, each sample to its own earlier tokens only: "
        "`per_sample` runs causal attention per sample; on CUDA `auto` takes `varlen` (torch "
        ">= 2.10, bfloat16 or float16), else `flash` (the flash-attn package, bfloat16 or "
        "float16), else `flex` (heads of at least 16), else `per_sample`; elsewhere "
        "`per_sample`. A named path that cannot run here is refused with the reason. `dense` "
        "is the quadratic T x T mask, for comparison only",
    )
    logprob_chunk_tokens: int = Field(
        1024,
        ge=0,
        description="LM head and log-softmax run this many tokens at a time (forward and "
        "backward), each run's temperature applied inside; 0 materialises the full "
        "[tokens, vocabulary] logits",
    )
    activation_checkpointing: bool | Literal["auto"] = Field(
        "auto",
        description="recompute decoder layers in backward instead of keeping their "
        "activations; `auto`: on CUDA, where memory bounds an update, off on the CPU",
    )
    share_prompts: bool | Literal["auto"] = Field(
        "auto",
        description="pack the completions of one prompt behind one copy of it: each after the "
        "first attends to the first's prompt tokens instead of repeating them (all but the "
        "last, which predicts its first token), so the prompt goes through the model once "
        "per group. The same log-probs and gradients, to float rounding. Needs attention "
        "`per_sample` or `dense`; `auto`: on where the attention path resolves to one of "
        "those (the CPU's), else off",
    )
    compile: bool = Field(
        False,
        description="torch.compile each decoder layer (optional, never needed; with "
        "activation checkpointing each layer is compiled inside its checkpoint)",
    )
    row_threads: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto",
        description="on the CPU, how many packed rows of an update compute at once, each on "
        "a thread of its own (a small model's products split badly over threads; rows do "
        "not); `auto`: as many as the trainer has torch threads. Gradients are the same, "
        "bit for bit, as one row after another; each row in flight holds its activations. "
        "One row at a time on a GPU, with compiled layers and with the base sharded",
    )

    @field_validator("rendezvous_port")
    @classmethod
    def _several_nodes_meet_at_a_fixed_port(cls, port: int, info: ValidationInfo) -> int:
        nnodes = info.data.get("nnodes", 1)
        if port == 0 and nnodes > 1:
            raise ValueError(
                f"nnodes = {nnodes} needs a fixed port that the other nodes can reach (0 picks "
                "one at random); set it, e.g. 29400"
            )
        return port

    @field_validator("share_prompts")
    @classmethod
    def _shared_prompts_need_an_attention_that_runs_them(
        cls, share: bool | str, info: ValidationInfo
    ) -> bool | str:
        attention = info.data.get("attention", "auto")
        if share is True and attention not in ("auto", *PROMPT_SHARING_ATTENTION):
            raise ValueError(
                f"share_prompts = true needs attention {' or '.join(PROMPT_SHARING_ATTENTION)}, "
                f'not {attention!r}; set share_prompts = "auto" or false'
            )
        return share

    def shares_prompts(self, attention: str) -> bool:
        """Whether rows share prompts once `attention` is resolved (`auto` -> a path)."""
        if self.share_prompts == "auto":
            return attention in PROMPT_SHARING_ATTENTION
        if self.share_prompts and attention not in PROMPT_SHARING_ATTENTION:
            raise ValueError(
                "trainer.share_prompts = true needs attention "
                f"{' or '.join(PROMPT_SHARING_ATTENTION)}, and "
                f'attention = "auto" resolved to {attention!r} here; set share_prompts = '
                '"auto" or false, or name the attention'
            )
        return bool(self.share_prompts)

    def shards_base(self, ranks: int) -> bool:
        """Whether `ranks` trainer ranks shard the base (`auto`: with more than one)."""
        if self.base_sharding == "auto":
            return ranks > 1
        return self.base_sharding == "sharded"


class TrackingSection(StrictModel):
    """Experiment tracking: the supervisor forwards every record of each run's metrics.jsonl
    to a tracker (`workbench.tracking`); trainer and orchestrators know nothing of it."""

    backend: Literal["none", "trackio", "wandb"] = Field(
        "none",
        description="none, trackio (local SQLite and a local dashboard: `trackio show`) or "
        "wandb (offline unless mode = online); one tracker run per workbench run",
    )
    project: str | None = Field(None, description="default: the experiment's name")
    dir: Path | None = Field(
        None,
        description="where the tracker keeps its files (relative: to where `workbench up` "
        "runs); default: trackio's own ($TRACKIO_DIR or ~/.cache/huggingface/trackio), "
        "the experiment directory for wandb (its wandb/ folder)",
    )
    mode: Literal["offline", "online"] = Field(
        "offline", description="wandb only: online also uploads, with your wandb login"
    )
    entity: str | None = Field(None, description="wandb only: the team or user to log under")

    @field_validator("backend")
    @classmethod
    def _library_installed(cls, backend: str) -> str:
        # A recipe error before launch, not a warning once the runs are going. A spec without
        # an origin is a bare folder of that name (wandb's own ./wandb output), no library.
        spec = importlib.util.find_spec(backend) if backend != "none" else None
        if backend != "none" and (spec is None or spec.origin is None):
            raise ValueError(
                f"{backend} is not installed in this environment ({sys.executable}); install "
                f"it with `pip install {backend}` or `pip install -e '.[tracking]'`, or set "
                'backend = "none"'
            )
        return backend

    @field_validator("mode", "entity")
    @classmethod
    def _wandb_options_need_wandb(cls, value: Any, info: ValidationInfo) -> Any:
        # Runs only for keys the recipe sets: a wandb option under trackio is a mistake (and
        # harmless with tracking off, so switching backend = "none" on and off is one line).
        backend = info.data.get("backend")
        if backend == "trackio":
            raise ValueError(
                f'applies to backend = "wandb" only (backend is {backend!r}): remove it or '
                "switch the backend"
            )
        return value


class TrainerConfig(StrictModel):
    """What `torchrun -m workbench.trainer.rl --config` reads (written by the supervisor)."""

    output_dir: Path = Field(description="the experiment directory, where the runs are")
    model: ModelSection = Field(description="the base model")
    trainer: TrainerSection = Field(
        default_factory=TrainerSection, description="the recipe's [trainer]"
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


# ------------------------------------------------------------------------- run ids


def normalize_run_id(raw: str) -> str:
    """`lr1e-3` -> `run_lr1e-3`; an id that already starts with `run_` is kept."""
    return raw if raw.startswith(layout.RUN_PREFIX) else layout.RUN_PREFIX + raw


# A run id names its directory (255 bytes at most on Linux) and shows in tables.
MAX_RUN_ID_CHARS = 128


def check_run_id(raw: str) -> str | None:
    """None if `raw` is a usable run id, else what is wrong with it."""
    if not raw:
        return "run id is empty"
    if len(raw) > MAX_RUN_ID_CHARS:
        return (
            f"run id {raw[:20]!r}... is {len(raw)} characters long; at most "
            f"{MAX_RUN_ID_CHARS} (it names a directory)"
        )
    if not layout.RUN_ID_PATTERN.match(raw):
        bad = sorted({c for c in raw if not re.match(r"[A-Za-z0-9_-]", c)})
        return (
            f"run id {raw!r} may contain only letters, digits, '_' and '-' "
            f"(found {' '.join(repr(c) for c in bad)})"
        )
    return None


# ------------------------------------------------------------------------- TOML I/O


def parse_toml(text: str, path: Path | str | None = None) -> tomlkit.TOMLDocument:
    try:
        return tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as err:
        message = str(err).split(" at line ")[0]
        raise ConfigError(
            path, [ConfigProblem(key="", message=f"not valid TOML: {message}", line=err.line)]
        ) from None
    except tomlkit.exceptions.KeyAlreadyPresent as err:
        # tomlkit's error for a key written twice in a [[runs]] table after the first: no line
        message = f"not valid TOML: {err} (a key is written twice in one table; keep one)"
        raise ConfigError(
            path, [ConfigProblem(key="", message=message, line=_repeated_key_line(text))]
        ) from None


def read_toml(path: Path) -> tuple[tomlkit.TOMLDocument, str]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            path, [ConfigProblem(key="", message="file not found; check the path")]
        ) from None
    except (IsADirectoryError, UnicodeDecodeError) as err:
        raise ConfigError(path, [ConfigProblem(key="", message=f"cannot read: {err}")]) from None
    return parse_toml(text, path), text


def model_to_toml(model: BaseModel, header: str | None = None) -> str:
    """Render a config model as TOML; None values are left out (TOML has no null)."""
    document = tomlkit.document()
    if header:
        for line in header.splitlines():
            document.add(tomlkit.comment(line))
        document.add(tomlkit.nl())
    for key, value in _drop_none(model.model_dump(mode="json")).items():
        document[key] = value
    return tomlkit.dumps(document)


def load_orchestrator_config(path: Path) -> OrchestratorConfig:
    document, text = read_toml(path)
    return validate_model(OrchestratorConfig, document.unwrap(), path, text)


def load_partial(model_cls: type[BaseModel], path: Path) -> dict[str, Any]:
    """The table of a file holding some of `model_cls`'s keys, the rest coming from
    elsewhere (`runs add --from`). Unknown keys and bad values are reported with this file
    and their line; missing keys and rules across keys wait for the merged config."""
    document, text = read_toml(path)
    data = document.unwrap()
    try:
        model_cls.model_validate(data)
    except ValidationError as err:
        problems = [
            problem_at(tuple(item["loc"]), explain_error(item, model_cls, tuple(item["loc"])), text)
            for item in err.errors()
            if item["loc"] and item["type"] != "missing"
        ]
        if problems:
            raise ConfigError(path, problems) from None
    return data


def load_trainer_config(path: Path) -> TrainerConfig:
    document, text = read_toml(path)
    return validate_model(TrainerConfig, document.unwrap(), path, text)


def load_inference_config(path: Path) -> InferenceConfig:
    document, text = read_toml(path)
    return validate_model(InferenceConfig, document.unwrap(), path, text)


def validate_model(
    model_cls: type[BaseModel], data: dict[str, Any], path: Path | str | None, text: str
) -> Any:
    try:
        return model_cls.model_validate(data)
    except ValidationError as err:
        raise ConfigError(path, problems_from_validation(err, model_cls, text)) from None


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """A copy of `base` with `override` applied; nested tables merge key by key."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def parse_assignment(assignment: str) -> tuple[str, Any]:
    """`lr=1e-3` or `sampling.temperature=0.7` -> (dotted key, TOML-typed value).

    Values are parsed as TOML, so `1e-3` is a float and `true` a bool; anything that is
    not valid TOML is taken as a plain string (`env=reverse_text`).
    """
    key, sep, value = assignment.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"expected KEY=VALUE, got {assignment!r}")
    try:
        parsed = tomlkit.parse(f"v = {value.strip()}")["v"]
        return key, parsed.unwrap() if hasattr(parsed, "unwrap") else parsed
    except tomlkit.exceptions.ParseError:
        return key, value.strip()


def nest_dotted(key: str, value: Any) -> dict[str, Any]:
    """`("sampling.temperature", 0.7)` -> `{"sampling": {"temperature": 0.7}}`."""
    result: dict[str, Any] = {}
    node = result
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return result


# ------------------------------------------------------------------------- error plumbing


def problems_from_validation(
    err: ValidationError, model_cls: type[BaseModel], text: str, prefix: tuple = ()
) -> list[ConfigProblem]:
    """Every error of a failed validation as a problem at its key and line."""
    problems = []
    for item in err.errors():
        loc = tuple(prefix) + tuple(item["loc"])
        problems.append(problem_at(loc, explain_error(item, model_cls, loc), text))
    return problems


def explain_error(item: dict[str, Any], model_cls: type[BaseModel], loc: tuple) -> str:
    """What one pydantic error means, in the words of every config error."""
    kind = item["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model_cls, loc[:-1])
        hint = ""
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        if close:
            hint = f"; did you mean {close[0]!r}?"
        return f"unknown key{hint} (allowed here: {', '.join(allowed)})"
    if kind == "missing":
        if loc == ("model", "base") or loc == ("model",):
            return 'missing base model: add [model] with base = "builtin:tiny-reverse" (or a path)'
        return "required key is missing"
    got = item.get("input")
    shown = repr(got) if not isinstance(got, dict) else "a table"
    message = item["msg"]
    if kind == "finite_number":
        return f"must be a finite number (got {shown}): inf and nan are no setting's value"
    if message.startswith("Value error, "):
        return message.removeprefix("Value error, ")
    return f"{message} (got {shown})"


def _allowed_keys(model_cls: type[BaseModel], loc: tuple) -> list[str]:
    current: Any = model_cls
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        field = getattr(current, "model_fields", {}).get(part)
        current = _optional_inner(field.annotation) if field is not None else None
        if current is not None and not (
            isinstance(current, type) and issubclass(current, BaseModel)
        ):
            current = None
    if isinstance(current, type) and issubclass(current, BaseModel):
        return sorted(current.model_fields)
    return []


def _optional_inner(annotation: Any) -> Any:
    """`X | None` -> X, so the keys of an optional table are listed too."""
    members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if isinstance(annotation, types.UnionType) and len(members) == 1:
        return members[0]
    return annotation


def problem_at(loc: tuple, message: str, text: str | None) -> ConfigProblem:
    """A problem at a key of a TOML text (its line found in `text`)."""
    return ConfigProblem(key=_render_loc(loc), message=message, line=_line_of(loc, text))


def _render_loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _dedupe(problems: list[ConfigProblem]) -> list[ConfigProblem]:
    seen = set()
    unique = []
    for problem in problems:
        marker = (problem.key, problem.message)
        if marker not in seen:
            seen.add(marker)
            unique.append(problem)
    return unique


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


_TABLE = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
_ARRAY_TABLE = re.compile(r"^\s*\[\[\s*([^\[\]]+?)\s*\]\]\s*(#.*)?$")
_KEY = re.compile(
    r"""^\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*="""
)


def _split_key(dotted: str) -> tuple[str, ...]:
    return tuple(part.strip().strip("\"'") for part in dotted.split("."))


def _key_lines(text: str) -> dict[tuple, int]:
    """Map every table header and key of a TOML text to its 1-based line.

    tomlkit keeps no line numbers for parsed keys, so this small scanner recovers them:
    `[a.b]` -> ("a", "b"), the n-th `[[runs]]` -> ("runs", n), `x = 1` under it ->
    ("runs", n, "x"). Good enough to point a user at the right line.
    """
    lines: dict[tuple, int] = {}
    table: tuple = ()
    array_counts: dict[tuple, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if match := _ARRAY_TABLE.match(line):
            name = _split_key(match.group(1))
            index = array_counts.get(name, -1) + 1
            array_counts[name] = index
            table = (*name, index)
            lines.setdefault(table, number)
        elif match := _TABLE.match(line):
            table = _split_key(match.group(1))
            lines.setdefault(table, number)
        elif match := _KEY.match(line):
            lines.setdefault((*table, *_split_key(match.group(1))), number)
    return lines


def _repeated_key_line(text: str) -> int | None:
    """The line of the first key written a second time in the same table, if any."""
    seen: set[tuple[int, tuple[str, ...]]] = set()
    table = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if _ARRAY_TABLE.match(line) or _TABLE.match(line):
            table += 1  # every header opens a table of its own
        elif match := _KEY.match(line):
            marker = (table, _split_key(match.group(1)))
            if marker in seen:
                return number
            seen.add(marker)
    return None


def _line_of(loc: tuple, text: str | None) -> int | None:
    if not text:
        return None
    lines = _key_lines(text)
    # Pydantic locations may go deeper than the source (inline tables, list items):
    # fall back to the longest prefix that the file spells out.
    for end in range(len(loc), 0, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None
