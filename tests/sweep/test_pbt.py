"""Population-based training's decisions (`workbench.sweep.pbt`): who is judged when,
against whom, who exploits whom, and how the settings are perturbed."""

from __future__ import annotations

import random

from workbench.sweep.asha import MetricPoint
from workbench.sweep.checks import Param
from workbench.sweep.pbt import Member, PbtDecision, decide, lineage, next_run_id, perturbed
from workbench.sweep.spec import LogUniform, PbtSpec

SPEC = PbtSpec(kind="pbt", interval=5, quantile=0.25, min_runs=3)
LR = {"lr": Param("lr", ("sweep", "grid", "lr"), values=[1e-3, 3e-3, 1e-2])}


def member(run_id: str, *points: tuple[int, float, float], **fields) -> Member:
    fields.setdefault("kept_steps", (5, 10))
    fields.setdefault("settings", {"lr": 3e-3})
    return Member(run_id, tuple(MetricPoint(*p) for p in points), max_steps=40, **fields)


def four_at_step_5() -> list[Member]:
    return [
        member("run_a", (0, 0.6, 1.0), (5, 0.80, 10.0)),
        member("run_b", (0, 0.6, 1.0), (5, 0.75, 11.0)),
        member("run_c", (0, 0.6, 1.0), (5, 0.70, 12.0)),
        member("run_d", (0, 0.6, 1.0), (5, 0.40, 13.0), settings={"lr": 3e-2}),
    ]


def test_the_last_of_four_takes_the_checkpoint_of_the_first_with_its_lr_perturbed():
    decisions = decide([], four_at_step_5(), SPEC, LR)
    assert [(d.run_id, d.decision, d.rank, d.of) for d in decisions] == [
        ("run_a", "continue", 1, 4),
        ("run_b", "continue", 2, 4),
        ("run_c", "continue", 3, 4),
        ("run_d", "exploit", 4, 4),
    ]
    exploit = decisions[-1]
    assert (exploit.source, exploit.source_step, exploit.source_value) == ("run_a", 10, 0.8)
    assert exploit.new_run == "run_d-pbt1"
    old, new = exploit.changes["lr"]
    assert old == 3e-3, "the winner's settings are perturbed, not the loser's"
    assert new in (2.4e-3, 3.6e-3) or new in LR["lr"].values
    assert exploit.reason("eval_reward_mean", "max").startswith(
        "pbt step 5: eval_reward_mean 0.4, rank 4/4, in the bottom quantile: run_a@10 "
        "(eval_reward_mean 0.8) goes on as run_d-pbt1 with lr 0.003 -> "
    )


def test_a_run_is_ranked_against_the_values_recorded_when_it_got_there():
    # run_b reaches step 5 first: then run_a's latest is its step-0 value, below run_b's.
    runs = [
        member("run_a", (0, 0.6, 1.0), (5, 0.9, 20.0)),
        member("run_b", (0, 0.6, 1.0), (5, 0.7, 10.0)),
        member("run_c", (0, 0.6, 1.0), (5, 0.8, 15.0)),
    ]
    decisions = {d.run_id: d for d in decide([], runs, SPEC, LR)}
    assert decisions["run_b"].decision == "continue" and decisions["run_b"].rank == 1
    # run_c's population: run_a 0.6 (step 0), run_b 0.7: it ranks first too.
    assert decisions["run_c"].rank == 1
    assert decisions["run_a"].rank == 1


def test_too_few_runs_with_a_value_and_ties_never_exploit():
    two = four_at_step_5()[2:]
    assert [d.decision for d in decide([], two, SPEC, LR)] == ["too_few", "too_few"]
    tied = [member(f"run_{x}", (5, 0.5, float(i))) for i, x in enumerate("abcd")]
    decided = [d.decision for d in decide([], tied, SPEC, LR)]
    assert decided == ["too_few", "too_few", "continue", "continue"]


def test_a_loser_goes_on_when_no_top_run_keeps_a_checkpoint_below_its_max_steps():
    runs = four_at_step_5()
    runs[0] = member("run_a", (0, 0.6, 1.0), (5, 0.8, 10.0), kept_steps=(40,))
    [*_, last] = decide([], runs, SPEC, LR)
    assert last.decision == "no_source"
    assert "no top run keeps a checkpoint" in last.reason("eval_reward_mean", "max")


def test_evicted_runs_are_not_in_the_population_and_decisions_are_never_revisited():
    runs = four_at_step_5()
    first = decide([], runs, SPEC, LR)
    assert decide(first, runs, SPEC, LR) == []
    evicted_winner = [member("run_a", (5, 0.95, 9.0), in_race=False), *runs[1:]]
    decisions = decide([], evicted_winner, SPEC, LR)
    assert [d.of for d in decisions] == [3, 3, 3]
    assert decisions[-1].source == "run_b"


def test_an_exploited_run_is_judged_no_more_and_its_fork_from_its_own_start():
    runs = four_at_step_5()
    first = decide([], runs, SPEC, LR)
    later = [
        member("run_d", (0, 0.6, 1.0), (5, 0.40, 13.0), (10, 0.3, 30.0)),  # exploited at 5
        member("run_d-pbt1", (10, 0.81, 31.0), start_step=10),
        *runs[:3],
    ]
    # The fork started at step 10: its first judged step is 15, not 10.
    assert decide(first, later, SPEC, LR) == []
    assert SPEC.judged_steps(40, start=10) == [15, 20, 25, 30, 35]


def test_min_mode_exploits_the_highest():
    # run_a reaches step 5 first with 0.8 (the highest: the worst), against the others'
    # step-0 values (0.6 each, tied for the top): it takes one of theirs.
    spec = PbtSpec(kind="pbt", interval=5, mode="min", metric="loss", min_runs=3)
    decisions = decide([], four_at_step_5(), spec, LR)
    assert decisions[0].run_id == "run_a" and decisions[0].decision == "exploit"
    assert decisions[0].source in ("run_b", "run_c", "run_d")


def test_replaying_the_same_records_gives_the_same_decisions():
    runs = four_at_step_5()
    assert decide([], runs, SPEC, LR) == decide([], runs, SPEC, LR)
    saved = [PbtDecision.from_json(d.to_json()) for d in decide([], runs, SPEC, LR)]
    assert saved == decide([], runs, SPEC, LR)


def test_floats_are_multiplied_or_drawn_afresh_and_other_values_drawn_from_the_sweep():
    spec = PbtSpec(kind="pbt", interval=5, factors=[0.5, 2.0], resample_probability=0.0)
    params = {
        "lr": Param("lr", ("sweep", "random", "lr"), distribution=LogUniform(
            distribution="log_uniform", low=1e-4, high=1e-2)),
        "batch_size": Param("batch_size", ("sweep", "grid", "batch_size"), values=[32, 64]),
    }  # fmt: skip
    for seed in range(20):
        changes = perturbed({"lr": 1e-3, "batch_size": 32}, params, spec, random.Random(seed))
        assert changes["lr"][1] in (5e-4, 2e-3)
        assert changes["batch_size"][1] in (32, 64)
    always = PbtSpec(kind="pbt", interval=5, resample_probability=1.0)
    for seed in range(20):
        new = perturbed({"lr": 1e-3}, params, always, random.Random(seed))["lr"][1]
        assert 1e-4 <= new <= 1e-2


def test_a_fork_is_named_for_its_member_and_generation():
    assert next_run_id("run_a", []) == "run_a-pbt1"
    assert next_run_id("run_a-pbt1", ["run_a-pbt2"]) == "run_a-pbt3"
    assert len(next_run_id("r" * 128, [])) == 128


def test_lineage_follows_the_forks_back_to_a_run_that_started_afresh():
    forked_from = {"run_c-pbt2": ("run_b-pbt1", 20), "run_b-pbt1": ("run_a", 10), "run_a": None}
    assert lineage("run_c-pbt2", forked_from) == ["run_c-pbt2", "run_b-pbt1@20", "run_a@10"]
    assert lineage("run_a", forked_from) == ["run_a"]
    assert lineage("x", {"x": ("y", 5), "y": ("x", 3)}) == ["x", "y@5", "x@3"]
