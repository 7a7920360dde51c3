"""Every config key is described where it is defined, and the documentation site's key
reference is those descriptions: `scripts/recipe_reference.py` renders them between two
markers of docs/reference/recipe-keys.md."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pydantic import BaseModel

from workbench.config import InferenceConfig, TrainerConfig, tagged_members
from workbench.envs.registry import environment_class, environment_names
from workbench.recipe import Recipe
from workbench.sweep.spec import DISTRIBUTIONS

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "recipe-keys.md"


def load_script():
    spec = importlib.util.spec_from_file_location(
        "recipe_reference", ROOT / "scripts" / "recipe_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fields_of(model: type[BaseModel], prefix: str = "") -> dict[str, object]:
    """Every field of `model` and of the models nested in it, by dotted name."""
    fields = {}
    for name, field in model.model_fields.items():
        fields[f"{prefix}{name}"] = field
        candidates = (field.annotation, *getattr(field.annotation, "__args__", ()))
        kinds = tagged_members(field.annotation)  # a table of several kinds: each kind's keys
        for candidate in (*candidates, *kinds.values()):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                fields.update(fields_of(candidate, f"{prefix}{name}."))
    return fields


def test_every_field_of_every_config_model_has_a_description():
    models = {
        "Recipe": Recipe,
        "TrainerConfig": TrainerConfig,
        "InferenceConfig": InferenceConfig,
        **{f"sweep.random {name}": model for name, model in DISTRIBUTIONS.items()},
        **{f"env_args of {name}": environment_class(name).Args for name in environment_names()},
    }
    undescribed = [
        f"{where}: {key}"
        for where, model in models.items()
        for key, field in fields_of(model).items()
        if not (field.description or "").strip()
    ]
    assert undescribed == []
    assert len(fields_of(Recipe)) > 70, "the walk reaches the nested tables"


def test_the_documented_recipe_reference_is_what_the_models_say():
    script = load_script()
    page = PAGE.read_text(encoding="utf-8")
    block = script.render_reference()
    assert block in page, f"{PAGE.name} is stale: run `python scripts/recipe_reference.py`"
    assert "`sampling.temperature`" in block and "`scheduler.min_runs`" in block
    # Each loss kind's knobs under its kind, with that kind's own default.
    assert "| `loss.eps_low` | number, >= 0, < 1 | `0.2` | kind `ppo`:" in block
    assert "| `loss.eps_low` | number, >= 0, < 1 | `0.0003` | kind `gspo`:" in block
    assert "| `loss.kl_coef` | number, >= 0 | `0.001` | kind `default`:" in block


def test_the_check_fails_on_a_stale_page_and_the_rewrite_fixes_it(tmp_path: Path):
    script = load_script()
    current = PAGE.read_text(encoding="utf-8")
    page = tmp_path / PAGE.name
    page.write_text(current.replace("adapters vLLM serves at once", "stale words"))
    assert script.main(["--check", "--page", str(page)]) == 1
    assert script.main(["--page", str(page)]) == 0
    assert page.read_text(encoding="utf-8") == current
    assert script.main(["--check", "--page", str(page)]) == 0
