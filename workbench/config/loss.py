"""A run's `loss` table: one pydantic class per `loss.kind`, each with its knobs and their
defaults, on a common base with the keys every kind takes.

`loss.kind` picks the class (a tagged union, as `[sweep.scheduler]` picks its kind); a
knob of another kind is refused by that class (extra keys are forbidden), and the error
names the kind(s) it belongs to (`workbench.config.loading.explain_error`). A kind given as
`package.module:function` is a loss of the user's (`UserLoss`), with its own `args`.

Adding a built-in kind: a class here, listed in `BUILTIN_LOSSES`, and its function in
`workbench/trainer/losses/builtin.py` under `@register_loss("<kind>")`.

A loss table is written as it was given (its kind and the keys set, see
`LossConfig._as_given`): a run whose `loss.kind` differs from its `[defaults]`' (or a fork
with `--set loss.kind=...`) then takes its own kind's defaults, not the other's.
"""

from __future__ import annotations

import inspect
import re
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BeforeValidator,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    Tag,
    TypeAdapter,
    field_validator,
    model_serializer,
    model_validator,
)

from workbench.config.base import StrictModel
from workbench.config.user_code import import_user_module, not_found_hint

LossAggregation = Literal["token_mean", "sequence_mean", "constant"]
LOSS_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
# The tag of a user's loss in the union, and how the docs and errors name its kind.
USER_KIND = "package.module:function"


def _aggregation_field(default: str) -> Any:
    return Field(
        default,
        description="how a run's token terms become its loss: `token_mean` over the run's "
        "step, `sequence_mean` (each completion's token mean, averaged), `constant` (the sum "
        "over `normaliser`, Dr. GRPO)",
    )


class LossConfig(StrictModel):
    """The keys every `loss.kind` takes; each kind is a subclass with its own knobs.

    Not made directly: a kind's class (`PpoLoss(eps_high=0.28)`) or `loss_config(...)`."""

    kind: str = Field(
        "default",
        description="the policy loss: `default` (prime-rl's masked importance sampling), "
        "`ppo` (clipped ratio, optional dual-clip), `gspo` (clipped sequence-level ratio), "
        "`cispo` (clipped stop-gradient importance weight), `is` (plain importance sampling), "
        "`reinforce` (no ratio), or `package.module:function` (your own; see the docs); each "
        "kind's own keys are below",
    )
    aggregation: LossAggregation = _aggregation_field("token_mean")
    normaliser: float | None = Field(
        None,
        gt=0,
        description="`constant` aggregation only: the sum is divided by this; unset: "
        "batch_size * sampling.max_tokens (TRL's dr_grpo)",
    )
    base_kl_coef: float = Field(
        0.0,
        ge=0,
        description="weight of a KL term to the base model (the adapter off), added per token; "
        "0: none, and no extra forward (verl's kl_loss_coef is 0.001)",
    )
    base_kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3",
        description="the KL term's estimator of d = logp - logp_base: k1 = d, k2 = d^2 / 2, "
        "k3 = exp(-d) + d - 1 (verl's low_var_kl, the default)",
    )

    def model_post_init(self, context: Any, /) -> None:
        if type(self) is LossConfig:
            raise TypeError("LossConfig is the kinds' base: use a kind's class or loss_config()")

    @model_validator(mode="after")
    def _normaliser_needs_constant(self) -> LossConfig:
        if self.normaliser is not None and self.aggregation != "constant":
            raise ValueError(
                f"loss.normaliser is for aggregation = 'constant', not "
                f"{self.aggregation!r}; remove it or set loss.aggregation = 'constant'"
            )
        return self

    @model_serializer(mode="wrap")
    def _as_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Written as given, so that merging it under a table of another kind ([defaults]
        # under a run, a run under `fork --set loss.kind=...`) carries no default of this kind
        # into that one; read back, the keys left out take their defaults again.
        data = handler(self)
        return {
            key: value
            for key, value in data.items()
            if key == "kind" or key in self.model_fields_set
        }


class DefaultLoss(LossConfig):
    """prime-rl's masked importance sampling with a (log ratio)^2 penalty."""

    kind: Literal["default"] = Field("default", description="masked importance sampling")
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


class PpoLoss(LossConfig):
    """verl `vanilla`: clip_ratio_low / clip_ratio_high 0.2; dual-clip (clip_ratio_c) off."""

    kind: Literal["ppo"] = Field("ppo", description="clipped ratio")
    eps_low: float = Field(
        0.2, ge=0, lt=1, description="the ratio is clipped below at 1 - eps_low (verl's 0.2)"
    )
    eps_high: float = Field(
        0.2,
        ge=0,
        description="the ratio is clipped above at 1 + eps_high (verl's 0.2; DAPO's "
        "clip-higher: 0.28)",
    )
    dual_clip: float | None = Field(
        None,
        gt=1,
        description="for negative advantages, bound the loss at -A * dual_clip (verl's "
        "clip_ratio_c, typically 3); unset: off",
    )


class GspoLoss(LossConfig):
    """The GSPO paper's sequence-ratio bounds, as verl's gspo example sets clip_ratio_low/high;
    verl forces seq-mean-token-mean aggregation for it."""

    kind: Literal["gspo"] = Field("gspo", description="clipped sequence-level ratio")
    aggregation: LossAggregation = _aggregation_field("sequence_mean")
    eps_low: float = Field(
        3e-4,
        ge=0,
        lt=1,
        description="the sequence ratio is clipped below at 1 - eps_low (the GSPO paper's 3e-4)",
    )
    eps_high: float = Field(
        4e-4,
        ge=0,
        description="the sequence ratio is clipped above at 1 + eps_high (the paper's 4e-4)",
    )


class CispoLoss(LossConfig):
    """Tinker `cispo`: clip_low_threshold 0, clip_high_threshold 4."""

    kind: Literal["cispo"] = Field("cispo", description="clipped stop-gradient weight")
    weight_low: float = Field(
        0.0,
        ge=0,
        description="lower bound of the stop-gradient importance weight (Tinker's 0)",
    )
    weight_high: float = Field(
        4.0,
        gt=0,
        description="upper bound of the stop-gradient importance weight (Tinker's 4)",
    )

    @model_validator(mode="after")
    def _bounds_in_order(self) -> CispoLoss:
        if self.weight_low >= self.weight_high:
            raise ValueError(
                f"loss.weight_low ({self.weight_low:g}) must be below loss.weight_high "
                f"({self.weight_high:g})"
            )
        return self


class IsLoss(LossConfig):
    """Tinker `importance_sampling`: no knobs."""

    kind: Literal["is"] = Field("is", description="plain importance sampling")


class ReinforceLoss(LossConfig):
    """verl `gpg`: no knobs."""

    kind: Literal["reinforce"] = Field("reinforce", description="no ratio")


class UserLoss(LossConfig):
    """Your own loss, `package.module:function`, with its own `args`."""

    kind: str = Field(description="`package.module:function`, a function of one LossInputs")
    args: dict[str, Any] = Field(
        default_factory=dict, description="the function's own arguments (`inputs.args`)"
    )

    @field_validator("kind")
    @classmethod
    def _loads(cls, kind: str) -> str:
        _check_loss_import_path(kind)
        return kind


BUILTIN_LOSSES: tuple[type[LossConfig], ...] = (
    DefaultLoss,
    PpoLoss,
    GspoLoss,
    CispoLoss,
    IsLoss,
    ReinforceLoss,
)
# Each built-in kind's class by its name; then the user's, by the tag that stands for it.
LOSS_KINDS: dict[str, type[LossConfig]] = {
    cls.model_fields["kind"].default: cls for cls in BUILTIN_LOSSES
}
LOSS_CLASSES: dict[str, type[LossConfig]] = {**LOSS_KINDS, USER_KIND: UserLoss}


def _loss_tag(value: Any) -> str | None:
    """The class a loss table is: its built-in kind, else the user's (which refuses a kind
    that is no import path, naming the built-in ones); None for a value that is no table."""
    if isinstance(value, dict):
        kind = value.get("kind", "default")
    elif isinstance(value, LossConfig):
        kind = value.kind
    else:
        return None
    return kind if isinstance(kind, str) and kind in LOSS_KINDS else USER_KIND


# Before each kind had a class, a run's orch.toml listed every key of one flat table: the
# `default` kind's four knobs at their defaults and an empty `args` under every kind. A table
# with all five so is read as such a file, without them (they were no one's choice).
_FLAT_TABLE = {
    "mask_ratio_low": 0.125,
    "mask_ratio_high": 8.0,
    "mask_both_sides": False,
    "kl_coef": 1e-3,
    "args": {},
}


def _from_flat_table(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    if all(key in value and value[key] == default for key, default in _FLAT_TABLE.items()):
        return {key: item for key, item in value.items() if key not in _FLAT_TABLE}
    return value


# The union of every kind's class, each tagged by its kind (the user's by USER_KIND).
_TAGGED_KINDS = tuple(Annotated[cls, Tag(tag)] for tag, cls in LOSS_CLASSES.items())
LossSpec = Annotated[
    Union[_TAGGED_KINDS],  # noqa: UP007 (a union built from a tuple)
    Discriminator(
        _loss_tag,
        custom_error_type="loss_table",
        custom_error_message='loss is a table, e.g. loss = { kind = "ppo", eps_high = 0.28 }',
    ),
    BeforeValidator(_from_flat_table),
]
LOSS_SPEC: TypeAdapter[LossConfig] = TypeAdapter(LossSpec)


def loss_config(kind: str = "default", **keys: Any) -> LossConfig:
    """The loss of `kind` with `keys`, validated as a recipe's `loss` table is."""
    return LOSS_SPEC.validate_python({"kind": kind, **keys})


def _check_loss_import_path(kind: str) -> None:
    """A loss of the user's: `package.module:function` that loads and takes one argument."""
    if not LOSS_IMPORT_PATH.match(kind):
        raise ValueError(
            f"unknown loss.kind {kind!r}; built in: {', '.join(LOSS_KINDS)}, or your "
            "own as package.module:function"
        )
    module_name, _, attribute = kind.partition(":")
    try:
        module = import_user_module(module_name)
    except Exception as err:  # an import error, or any error the module raises as it loads
        raise ValueError(
            f"loss.kind {kind!r}: cannot import module {module_name!r} ({err}); " + not_found_hint()
        ) from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ValueError(f"loss.kind {kind!r}: {module_name} has no function {attribute!r}")
    try:
        inspect.signature(function).bind(None)
    except (TypeError, ValueError):
        raise ValueError(
            f"loss.kind {kind!r}: {attribute} must take one argument, the run's LossInputs "
            f"(def {attribute}(inputs: LossInputs) -> TokenLoss)"
        ) from None
