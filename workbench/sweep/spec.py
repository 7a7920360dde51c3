"""The `[sweep]` table of a recipe: what to vary, how many runs, and early stopping.

Only the shape lives here (pydantic models); `workbench.sweep.checks` checks the keys
against the orchestrator's config and `workbench.sweep.expand` expands the table into
runs. This module imports nothing of workbench.

    [sweep]
    repeats = 2            # runs of each configuration, with seeds seed, seed + 1, ...
    num_samples = 4        # draws of [sweep.random]
    seed = 0               # seeds the draws
    max_runs = 64          # refuse a sweep that expands to more runs
    ids = "auto"           # auto | values | index

    [sweep.grid]           # every combination of these lists
    lr = [1e-4, 3e-4]
    lora.rank = [4, 8]

    [sweep.random]         # one draw per sample
    "sampling.temperature" = { distribution = "uniform", low = 0.7, high = 1.2 }

    [sweep.scheduler]
    kind = "asha"          # or "pbt": population-based training (PbtSpec)
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    model_validator,
)

# Above this, a typo in a grid (a list of 1000 values) is likelier than a real plan.
MAX_RUNS_LIMIT = 1000
DEFAULT_MAX_RUNS = 64


class _Strict(BaseModel):
    """Unknown keys are errors, and no bound is inf or nan (as in every recipe section)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# ---------------------------------------------------------------- distributions


class Choice(_Strict):
    """One of `values`, each equally likely."""

    distribution: Literal["choice"] = Field(description='"choice"')
    values: list[Any] = Field(min_length=1, description="the values, each equally likely")


class _FloatRange(_Strict):
    low: float = Field(description="the lowest value")
    high: float = Field(description="the highest value, above low")

    @model_validator(mode="after")
    def _bounds_in_order(self) -> _FloatRange:
        if not self.low < self.high:
            raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
        return self


class Uniform(_FloatRange):
    """A float drawn evenly from [low, high]."""

    distribution: Literal["uniform"] = Field(description='"uniform"')


class LogUniform(_FloatRange):
    """A float whose logarithm is drawn evenly: as likely in [1e-4, 1e-3] as in [1e-3, 1e-2]."""

    distribution: Literal["log_uniform"] = Field(description='"log_uniform"')
    low: float = Field(gt=0, description="the lowest value, above 0")
    high: float = Field(gt=0, description="the highest value, above low")


class IntRange(_Strict):
    """An integer drawn evenly from low..high, both included."""

    distribution: Literal["int"] = Field(description='"int"')
    low: int = Field(description="the lowest value, included")
    high: int = Field(description="the highest value, included; not below low")

    @model_validator(mode="after")
    def _bounds_in_order(self) -> IntRange:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not be above high ({self.high})")
        return self


Distribution = Choice | Uniform | LogUniform | IntRange
DISTRIBUTIONS: dict[str, type[BaseModel]] = {
    "choice": Choice,
    "uniform": Uniform,
    "log_uniform": LogUniform,
    "int": IntRange,
}


def bounds_of(distribution: Distribution) -> list[Any]:
    """The values that stand for a distribution when checking them as config values."""
    if isinstance(distribution, Choice):
        return list(distribution.values)
    return [distribution.low, distribution.high]


# ---------------------------------------------------------------- schedulers


def _metric_field() -> Any:
    """What a scheduler ranks runs by (both kinds spell it alike)."""
    return Field(
        "eval_reward_mean",
        min_length=1,
        description="any key of the runs' `metrics.jsonl` records, e.g. `reward_mean`",
    )


def _mode_field() -> Any:
    return Field("max", description="`max`: higher values are better; `min`: lower ones")


class AshaSpec(_Strict):
    """`[sweep.scheduler]`: asynchronous successive halving (Ray Tune's ASHA).

    Rungs sit at steps grace_steps * reduction_factor**k below a run's max_steps. When a
    run reaches a rung, its metric there is ranked against every run that recorded that
    rung so far; it is evicted if it falls in the bottom (1 - 1/reduction_factor).
    """

    kind: Literal["asha"] = Field(
        "asha", description="asynchronous successive halving (Ray Tune's ASHA); the default"
    )
    grace_steps: int = Field(
        5,
        ge=1,
        description="the first rung's step; for eval metrics a multiple of `eval.interval`, so "
        "that each rung has a record",
    )
    reduction_factor: int = Field(
        2,
        ge=2,
        description="rungs at `grace_steps * reduction_factor^k` below `max_steps`; at each, a "
        "run below the `1 - 1/reduction_factor` quantile is evicted",
    )
    metric: str = _metric_field()
    mode: Literal["max", "min"] = _mode_field()
    min_runs: int = Field(
        3, ge=1, description="a run's judgement at a rung waits until this many reached it"
    )

    def rung_steps(self, max_steps: int) -> list[int]:
        """The steps of the rungs below `max_steps`: grace, grace*rf, grace*rf**2, ..."""
        steps = []
        step = self.grace_steps
        while step < max_steps:
            steps.append(step)
            step *= self.reduction_factor
        return steps


class PbtSpec(_Strict):
    """`[sweep.scheduler]` with `kind = "pbt"`: population-based training (Ray Tune's PBT).

    Every `interval` steps a run is ranked by its metric against the latest values of the
    runs still training; one in the bottom `quantile` takes the newest checkpoint of a run
    in the top `quantile` (a fork) with that run's settings, the `perturb` keys perturbed.
    """

    kind: Literal["pbt"] = Field(description='"pbt": population-based training')
    interval: int = Field(
        ge=1,
        description="a run is judged at steps interval, 2*interval, ... below its max_steps; a "
        "multiple of `eval.interval` (for eval metrics) and of `checkpoint_interval`",
    )
    metric: str = _metric_field()
    mode: Literal["max", "min"] = _mode_field()
    quantile: float = Field(
        0.25,
        gt=0,
        le=0.5,
        description="the bottom quantile takes a checkpoint of the top quantile (at least one "
        "run each once `min_runs` are ranked)",
    )
    perturb: list[str] | None = Field(
        None,
        description="the `[sweep]` keys a fork perturbs; by default every grid and random key a "
        "fork may change (not `lora.rank` or `lora.alpha`: they come with the checkpoint)",
    )
    factors: list[float] = Field(
        default_factory=lambda: [0.8, 1.2],
        min_length=1,
        description="a float key is multiplied by one of these, chosen at random",
    )
    resample_probability: float = Field(
        0.25,
        ge=0,
        le=1,
        description="the chance a key is drawn afresh from its `[sweep]` values or distribution "
        "instead; keys that are not floats are always drawn afresh",
    )
    min_runs: int = Field(
        3, ge=2, description="judge a run only once this many runs have a value to rank"
    )

    @model_validator(mode="after")
    def _factors_change_something(self) -> PbtSpec:
        bad = [factor for factor in self.factors if not factor > 0]
        if bad:
            raise ValueError(f"factors must be above 0 (found {bad[0]:g}), e.g. [0.8, 1.2]")
        if all(factor == 1 for factor in self.factors):
            raise ValueError("factors are all 1: nothing would change; e.g. [0.8, 1.2]")
        return self

    def judged_steps(self, max_steps: int, start: int = 0) -> list[int]:
        """The steps after `start` and below `max_steps` where a run is judged."""
        first = (start // self.interval + 1) * self.interval
        return list(range(first, max_steps, self.interval))


def _scheduler_kind(value: Any) -> str:
    # `kind` may be left out for ASHA, which came first.
    if isinstance(value, dict):
        return str(value.get("kind", "asha"))
    return str(getattr(value, "kind", "asha"))


SchedulerSpec = Annotated[
    Annotated[AshaSpec, Tag("asha")] | Annotated[PbtSpec, Tag("pbt")],
    Discriminator(_scheduler_kind),
]
SCHEDULER_SPEC: TypeAdapter[AshaSpec | PbtSpec] = TypeAdapter(SchedulerSpec)
SCHEDULER_MODELS: dict[str, type[BaseModel]] = {"asha": AshaSpec, "pbt": PbtSpec}


# ---------------------------------------------------------------- the table


class SweepSection(_Strict):
    """`[sweep]`: grid and random keys are any `[defaults]` key, dotted for nested ones."""

    grid: dict[str, Any] = Field(
        default_factory=dict,
        description="key -> list of values; every combination of the lists is a configuration",
    )
    random: dict[str, Any] = Field(
        default_factory=dict,
        description="key -> distribution (below); one draw per sample, combined with every "
        "grid point",
    )
    num_samples: int | None = Field(
        None, ge=1, description="draws of `[sweep.random]` (required with it)"
    )
    seed: int = Field(
        0,
        description="seeds the draws; a draw depends on the seed, the sample and the key only",
    )
    repeats: int = Field(
        1, ge=1, description="runs of each configuration; repeat r adds r to its seed"
    )
    max_runs: int = Field(
        DEFAULT_MAX_RUNS,
        ge=1,
        le=MAX_RUNS_LIMIT,
        description="refuse a sweep that expands to more runs",
    )
    ids: Literal["auto", "values", "index"] = Field(
        "auto",
        description="run ids: `values` (`run_lr3e-3_rank8`), `index` (`run_sweep07`), or `auto`: "
        "values when every id is readable, unique and at most 64 characters, else an index",
    )
    scheduler: SchedulerSpec | None = Field(
        None,
        description="`asha`: early stopping of runs that fall behind; `pbt`: population-based "
        "training; none by default",
    )
