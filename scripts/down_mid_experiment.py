"""Stop an experiment with `workbench down` in the middle of training and check that nothing
was lost: then start it again and check that every run resumes where it stopped.

    python scripts/down_mid_experiment.py RECIPE [--after-steps 4] [--max-steps 12]

Runs in a scratch copy of RECIPE's directory layout (the recipe is copied into a temporary
directory; its `output_dir` lands there). After `down`, for every run:

- the trainer's last logged update is in its newest checkpoint (what it trained, it kept);
- nothing is left half-written (`bench.faults.invariants.half_written`);
- `workbench down` exited 0, which it does once nothing the supervisor started is left.

After `up` again, to the end: every run's trainer logged each update 1..max_steps exactly
once (none skipped, none trained twice) and every run finished. Prints a JSON summary;
exit status 1 if a check failed. A check of many runs at once, minutes long, so not in the
test suite, which checks a stop's checkpoint in the trainer's own tests
(tests/trainer/rl/test_rl_trainer.py) and a scancel's on two nodes (tests/slurm).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workbench.bench.faults import invariants
from workbench.files import layout

WORKBENCH = [sys.executable, "-m", "workbench.cli"]


def wait_until(ready, up: subprocess.Popen, what: str, timeout_s: float):
    """Poll `ready()` every 2 s until it returns something true; that value. Stops the
    script if `up` exits or `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while not (value := ready()):
        if up.poll() is not None:
            raise SystemExit(f"workbench up exited with {up.returncode} before {what}")
        if time.monotonic() > deadline:
            raise SystemExit(f"not {what} in {timeout_s:.0f} s")
        time.sleep(2)
    return value


def trained_to(run: Path) -> int:
    return max(invariants.trained_steps(run), default=0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", type=Path)
    parser.add_argument("--after-steps", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=12)
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="workbench-down-"))
    recipe = scratch / "recipe.toml"
    shutil.copy(args.recipe, recipe)
    up_cmd = [*WORKBENCH, "up", str(recipe), "--headless", "--max-steps", str(args.max_steps)]
    log = open(scratch / "up.log", "w")  # noqa: SIM115 - open for both starts
    up = subprocess.Popen(up_cmd, cwd=scratch, stdout=log, stderr=subprocess.STDOUT)
    experiment = wait_until(
        lambda: next(iter((scratch / "outputs").glob("*")), None), up, "an experiment", 300
    )
    runs = wait_until(lambda: sorted(experiment.glob("run_*")), up, "its runs", 300)
    wait_until(
        lambda: min(trained_to(run) for run in runs) >= args.after_steps,
        up,
        f"every run at step {args.after_steps}",
        1800,
    )

    started = time.monotonic()
    down = subprocess.run([*WORKBENCH, "down", str(experiment)], capture_output=True, text=True)
    down_s = time.monotonic() - started
    up.wait(timeout=60)
    problems: list[str] = []
    if down.returncode != 0:
        problems.append(f"workbench down exited {down.returncode}: {down.stderr[-500:]}")
    at_down = {}
    for run in runs:
        trained = trained_to(run)
        kept = layout.latest_checkpoint_step(run, "trainer") or 0
        at_down[run.name] = {"trained": trained, "checkpoint": kept}
        if kept != trained:
            problems.append(f"{run.name}: trained to step {trained}, newest checkpoint {kept}")
    problems += [f"half-written: {path}" for path in invariants.half_written(experiment, set())]

    up = subprocess.Popen(up_cmd, cwd=scratch, stdout=log, stderr=subprocess.STDOUT)
    resumed_ok = up.wait(timeout=3600) == 0
    if not resumed_ok:
        problems.append(f"the second workbench up exited {up.returncode} (see {scratch}/up.log)")
    for run in runs:
        missing = sorted(set(range(1, args.max_steps + 1)) - set(invariants.trained_steps(run)))
        if missing:
            problems.append(f"{run.name}: updates never logged: {missing}")
        if twice := invariants.recomputed_steps(run):
            problems.append(f"{run.name}: {twice} update(s) logged more than once")
    summary = {
        "runs": len(runs),
        "down_s": round(down_s, 1),
        "trained_at_down": sorted({v["trained"] for v in at_down.values()}),
        "problems": problems,
        "scratch": str(scratch),
    }
    print(json.dumps(summary, indent=2))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
