"""One run's config (`control/orch.toml`, the recipe's `[defaults]`): sampling, eval,
optimizer, scheduler, loss (its kinds in `workbench.config.loss`) and advantages. Every field has a default, so an empty file is a
valid run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from workbench.config.base import StrictModel
from workbench.config.loading import read_toml, validate_model
from workbench.config.loss import DefaultLoss, LossSpec


class RunLoraConfig(StrictModel):
    """A run may ask for a smaller rank than the trainer's slots; None takes the trainer's."""

    rank: int | None = Field(
        None, ge=1, description="this run's LoRA rank, at most the trainer's; unset: the trainer's"
    )
    alpha: float | None = Field(
        None, gt=0, description="this run's LoRA alpha; unset: the trainer's"
    )
    init_from: str | None = Field(
        None,
        description="start the adapter from this peft LoRA adapter directory (`workbench "
        "export`'s or `workbench sft --lora`'s output, a run's broadcast/step_N): same base "
        "model, target modules among the trainer's, rank at most the run's; a relative path "
        "is taken from where the recipe is loaded. Unset: a fresh adapter",
    )

    @field_validator("init_from")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        # The trainer reads it from orch.toml in a directory of its own: written absolute.
        return None if value is None else str(Path(value).expanduser().absolute())


class ForkedFrom(StrictModel):
    """Where a run made by `workbench runs fork` came from: a record for people and reports.
    What the run starts from is the checkpoint in its own `checkpoints/`."""

    run: str = Field(description="the run whose checkpoint this run started from")
    step: int = Field(ge=0, description="the step of that checkpoint: this run's first step")


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


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples: what travels from a run's config to the server's HTTP body.

    Built from `SamplingConfig` (training) or `EvalSamplingConfig` (evals, which may be
    greedy, so it cannot be a `SamplingConfig`). A request's seed is not here: each prompt
    has its own.
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0


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

    def params(self) -> SamplingParams:
        """The training requests' sampling."""
        return SamplingParams(
            max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p
        )


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

    def params(self, run_max_tokens: int) -> SamplingParams:
        """The eval requests' sampling; `run_max_tokens` (the run's `sampling.max_tokens`)
        when `max_tokens` is unset."""
        return SamplingParams(
            max_tokens=self.max_tokens or run_max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
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


class AdvantageConfig(StrictModel):
    """How a completion's reward becomes its advantage, within the run's own step."""

    baseline: Literal["group_mean", "leave_one_out"] = Field(
        "group_mean",
        description="subtracted from each reward: its group's mean (GRPO, Dr. GRPO), or the "
        "mean of the other completions of its prompt (RLOO)",
    )
    scale: Literal["none", "group_std", "batch_std"] = Field(
        "none",
        description="what the centred reward is divided by: nothing (Dr. GRPO), its group's "
        "reward std (GRPO), or the std of the run's step's advantages (REINFORCE++); never "
        "another run's",
    )
    std_eps: float = Field(
        1e-6, gt=0, description="added to the std before dividing (verl's GRPO epsilon)"
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
    loss: LossSpec = Field(
        default_factory=DefaultLoss,
        description="the policy loss: masked importance sampling with a small KL-style penalty "
        "unless `loss.kind` names another; each kind takes its own keys",
    )
    advantage: AdvantageConfig = Field(
        default_factory=AdvantageConfig,
        description="each completion's advantage: its reward minus its group's mean unless "
        "`advantage.baseline` / `advantage.scale` say otherwise",
    )
    eval: EvalConfig = Field(
        default_factory=EvalConfig,
        description="scoring the policy on the environment's held-out prompts",
    )
    source: Literal["recipe", "tinker"] = Field(
        "recipe",
        description="what drives the run: `recipe`, its orchestrator; `tinker`, a Tinker "
        "client through `workbench serve` (no orchestrator: the client sends the trainer's "
        "work, docs/guides/tinker.md; written by the service, not by hand)",
    )
    forked_from: ForkedFrom | None = Field(
        None,
        description="written by `workbench runs fork`: the run and step whose checkpoint "
        "this run started from (shown by `status`; not set by hand)",
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


def load_orchestrator_config(path: Path) -> OrchestratorConfig:
    document, text = read_toml(path)
    return validate_model(OrchestratorConfig, document.unwrap(), path, text)
