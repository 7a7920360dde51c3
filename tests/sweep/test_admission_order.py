"""More runs than trainer slots: the runs of a recipe wait, and take slots, in recipe
order ([[runs]] first, then the sweep's expansion order), whatever their ids."""

from __future__ import annotations

import os
from pathlib import Path

import tomlkit

from workbench.experiment import create_experiment
from workbench.files import layout, run_control
from workbench.recipe import recipe_from_document
from workbench.trainer.runs.manager import MultiRunManager

RECIPE = """\
[experiment]
name = "order"
output_dir = "{output_dir}"

[model]
base = "builtin:tiny-reverse"

[trainer]
max_concurrent_runs = 1

[[runs]]
id = "zz_baseline"

[sweep.grid]
lr = [3e-3, 1e-3, 2e-3]
"""


def test_waiting_runs_take_freed_slots_in_recipe_order(tmp_path: Path, monkeypatch):
    # Files written in one loop may share a clock tick; make sure they all do here, so
    # the order cannot come from luck.
    write = layout.atomic_write_text

    def write_in_one_tick(path: Path, text: str, mode: int | None = None) -> None:
        write(path, text, mode)
        os.utime(path, ns=(10**18, 10**18))

    monkeypatch.setattr(layout, "atomic_write_text", write_in_one_tick)
    document = tomlkit.parse(RECIPE.format(output_dir=tmp_path / "exp"))
    experiment = create_experiment(recipe_from_document(document, "recipe.toml"), document)
    manager = MultiRunManager(experiment, max_runs=1)

    admitted = []
    for _ in range(4):
        manager.discover_runs()
        manager.synchronize_state()
        [run_id] = manager.idx_2_id.values()
        admitted.append(run_id)
        if len(admitted) == 1:
            assert manager.waiting_run_ids == ["run_lr3e-3", "run_lr1e-3", "run_lr2e-3"]
        # The freed slot goes to the next run in the same discovery that lets this one go.
        run_control.write_eviction(layout.run_dir(experiment, run_id), "next", by="test")
    assert admitted == ["run_zz_baseline", "run_lr3e-3", "run_lr1e-3", "run_lr2e-3"]
