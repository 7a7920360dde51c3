"""The recipe's `[alerts]` section: which rules the supervisor checks as records arrive, and
their thresholds (`workbench.alerts`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from workbench.config.base import StrictModel

AlertRule = Literal[
    "reward_collapse", "eval_regression", "non_finite", "kl_spike", "ratio_spike", "stall",
    "restarts",
]  # fmt: skip
ALERT_RULES: tuple[str, ...] = AlertRule.__args__  # type: ignore[attr-defined]


class AlertsSection(StrictModel):
    """Alerts: the supervisor checks every run's metrics.jsonl and its processes' exits as
    they come and appends one line to `alerts.jsonl` per episode of a condition (shown by
    `workbench alerts`, the TUI and, with `[tracking]`, trackio's or W&B's alerts). On by
    default; the defaults stay quiet on healthy runs of the built-in tasks (rewards 0 to 1)."""

    enabled: bool = Field(True, description="false: no rule is checked")
    disabled: list[AlertRule] = Field(
        default_factory=list,
        description="rules switched off by name, the others still checked",
    )
    reward_drop: float = Field(
        0.25,
        gt=0,
        description="reward_collapse: the mean reward of the last 3 steps this far (in reward "
        "units) below its highest over the last `reward_window` steps",
    )
    reward_window: int = Field(
        10, ge=2, description="reward_collapse: steps the drop is measured over"
    )
    eval_drop: float = Field(
        0.15,
        gt=0,
        description="eval_regression: a held-out eval this far below the run's best earlier one",
    )
    kl_factor: float = Field(
        10.0,
        gt=1,
        description="kl_spike: `base_kl` this many times the median of its previous 10 "
        "updates (runs with `loss.base_kl_coef` > 0 record it) ...",
    )
    kl_min: float = Field(0.05, gt=0, description="kl_spike: ... and at least this")
    ratio_limit: float = Field(
        2.0,
        gt=1,
        description="ratio_spike: an update's mean importance ratio (trainer / sampler) above "
        "this or below its inverse",
    )
    stall_s: float = Field(
        900.0,
        gt=0,
        description="stall: seconds an open run (not finished, evicted or rejected) that has "
        "recorded a step goes without recording another",
    )
    restarts: int = Field(
        3, ge=1, description="restarts: failed exits of one process within `restarts_window_s`"
    )
    restarts_window_s: float = Field(600.0, gt=0, description="restarts: the window, seconds")

    def checks(self, rule: str) -> bool:
        return self.enabled and rule not in self.disabled
