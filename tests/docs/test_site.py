"""The documentation: the site builds with every link and anchor resolved, its generated
command reference is what the Typer app says, every file a page or the README names
exists, and every shipped recipe the docs point at is a valid recipe."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").rglob("*.md"))
READ_BY_USERS = [ROOT / "README.md", *PAGES]
# Paths into the repository that a page names, in a code block or a code span.
REPOSITORY_PATH = re.compile(r"\b(?:recipes|configs|scripts|benchmarks/results)/[\w./*-]*[\w*]")
# A result file named alone, e.g. `e2e-separate-20261126T100912.json`.
RESULT_FILE = re.compile(r"\b[a-z][\w-]*-2026\d{4}(?:T\d{6})?[\w-]*\.(?:json|txt|png)\b")


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def code_of(page: Path) -> str:
    """The code blocks and code spans of a page: where commands and paths are written."""
    text = page.read_text(encoding="utf-8")
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.M))
    return "\n".join(blocks + spans)


def test_the_site_builds_strictly(tmp_path: Path):
    site = tmp_path / "site"
    build = [sys.executable, "-m", "mkdocs", "build", "--strict"]
    done = subprocess.run(
        [*build, "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "workbench up" in (site / "reference" / "cli" / "index.html").read_text()
    assert "sampling.temperature" in (site / "reference" / "recipe-keys" / "index.html").read_text()
    # The TUI's pictures are its tests' snapshots, served by the site's hook.
    assert (site / "assets" / "tui" / "main_screen_160x48.svg").is_file()


def test_the_command_reference_is_what_the_typer_app_says():
    script = load_script("cli_reference")
    page = script.PAGE.read_text(encoding="utf-8")
    assert page == script.render_page(), "run `python scripts/cli_reference.py`"
    for command in (
        "## `workbench up`",
        "### `workbench sweep plan`",
        "### `workbench bench faults`",
    ):
        assert command in page
    assert "--dry-run" in page and "--node-rank" in page


def test_the_check_fails_on_a_stale_command_reference_and_the_rewrite_fixes_it(tmp_path: Path):
    script = load_script("cli_reference")
    current = script.PAGE.read_text(encoding="utf-8")
    page = tmp_path / "cli.md"
    page.write_text(current.replace("Open the TUI on a running experiment", "stale words"))
    assert script.main(["--check", "--page", str(page)]) == 1
    assert script.main(["--page", str(page)]) == 0
    assert page.read_text(encoding="utf-8") == current
    assert script.main(["--check", "--page", str(page)]) == 0


def test_the_figures_are_the_newest_results_and_the_readme_and_home_page_agree():
    """The Figures page, the README's table and the home page's are written from
    benchmarks/results/ (`just docs-reference`): a new result makes them stale until the
    script runs, and the two tables are one block, so they cannot disagree."""
    script = load_script("figures_page")
    assert script.main(["--check"]) == 0, "run `python scripts/figures_page.py`"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    home = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    page = script.PAGE.read_text(encoding="utf-8")

    def block(text: str) -> str:
        return text.split(script.BEGIN, 1)[1].split(script.END, 1)[0]

    assert block(readme) == block(home)
    for row in block(readme).strip().splitlines()[2:]:
        assert row.split("`")[1].split("/")[-1] in page, "each row's file is on the page"
    assert "e2e-separate-20261206T061144.json" in page and "## Trainer on a GPU" in page


def test_the_figures_check_fails_on_a_new_result_and_the_rewrite_fixes_it(tmp_path: Path):
    script = load_script("figures_page")
    results = tmp_path / "results"
    results.mkdir()
    for path in (ROOT / "benchmarks" / "results").glob("*.json"):
        (results / path.name).write_bytes(path.read_bytes())
    copies = {}
    for name, source in (("page", script.PAGE), ("readme", script.README), ("home", script.HOME)):
        copies[name] = tmp_path / f"{name}.md"
        copies[name].write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    argv = ["--results", str(results), *(f"--{k}={v}" for k, v in copies.items())]
    assert script.main(["--check", *argv]) == 0
    newer = json.loads((results / "e2e-separate-20261206T061144.json").read_text())
    newer.update(created="20271231T235959", speedup={"one_after_another": 9.99, "at_once": None})
    (results / "e2e-separate-20271231T235959.json").write_text(json.dumps(newer))
    (results / "e2e-separate-20281231T235959-before.json").write_text(json.dumps(newer))
    assert script.main(["--check", *argv]) == 1
    assert script.main(argv) == 0 and script.main(["--check", *argv]) == 0
    for name in ("readme", "home", "page"):
        text = copies[name].read_text(encoding="utf-8")
        assert "**9.99x**" in text or "9.99x" in text
        assert "e2e-separate-20271231T235959.json" in text
        assert "-before" not in text.split(script.BEGIN)[1], "a tagged file is not of record"


@pytest.mark.parametrize("page", READ_BY_USERS, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_file_a_page_names_exists(page: Path):
    code = code_of(page)
    named = set(REPOSITORY_PATH.findall(code))
    missing = sorted(path for path in named if not any(ROOT.glob(path)))
    results = set(RESULT_FILE.findall(code))
    missing += sorted(
        f"benchmarks/results/{name}"
        for name in results
        if not (ROOT / "benchmarks" / "results" / name).exists()
    )
    assert missing == []


def test_the_pages_name_what_they_should():
    """The checks above would pass on pages that name nothing: they name the recipes."""
    named = {path for page in READ_BY_USERS for path in REPOSITORY_PATH.findall(code_of(page))}
    shipped = {f"recipes/{recipe.name}" for recipe in (ROOT / "recipes").glob("*.toml")}
    assert shipped <= named, "every shipped recipe is documented"


@pytest.mark.parametrize("recipe", sorted((ROOT / "recipes").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_recipe_is_valid(recipe: Path):
    loaded = load_recipe(recipe)
    assert loaded.run_configs(), f"{recipe.name} has runs"


def test_the_gpu_recipe_is_complete_and_bf16():
    """The recipe the GPU guide tells a user to copy: their model in bf16 on their data."""
    recipe = load_recipe(ROOT / "recipes" / "gpu_own_data.toml")
    assert recipe.trainer.dtype == "bfloat16" and recipe.inference.dtype in ("auto", "bfloat16")
    assert recipe.inference.gpus == recipe.trainer.gpus == [0]
    configs = list(recipe.run_configs().values())
    assert {config.env for config in configs} == {"dataset"}
    data = Path(configs[0].env_args["path"])
    assert data.is_file(), "the data file it names ships with it"
    assert recipe.inference.max_loras >= 2 * recipe.trainer.max_concurrent_runs


def slug(heading: str) -> str:
    """The anchor mkdocs (and GitHub) give a heading: lower case, words joined by '-'."""
    words = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"\s+", "-", words)


def test_the_readme_links_resolve():
    """The README is read on GitHub, outside the site's strict build: its links into the
    docs (and their anchors) must hold too."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert len(targets) > 20, "the README points into the docs"
    broken = []
    for target in targets:
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        if not (ROOT / path).exists():
            broken.append(target)
        elif anchor:
            headings = re.findall(r"^#+ (.+)$", (ROOT / path).read_text(encoding="utf-8"), re.M)
            if anchor not in {slug(heading) for heading in headings}:
                broken.append(target)
    assert broken == []
    assert len(readme.splitlines()) <= 250, "the README stays a five-minute read"


# Variables of the inference changes in flight (issues 36 and 45), whose documentation comes
# with those changes; remove them here when the page names them.
def test_every_workbench_environment_variable_is_documented():
    code = "\n".join(
        path.read_text(encoding="utf-8") for path in (ROOT / "workbench").rglob("*.py")
    )
    variables = set(re.findall(r"\bWORKBENCH_[A-Z_]+[A-Z]\b", code))
    page = (ROOT / "docs" / "reference" / "environment-variables.md").read_text(encoding="utf-8")
    undocumented = sorted(name for name in variables if f"`{name}`" not in page)
    assert "WORKBENCH_NICE" in variables, "the scan finds the variables"
    assert undocumented == []


def test_ci_runs_the_readmes_test_command():
    """The README promises two commands on a fresh machine; the second is the test
    command CI runs, word for word, so a fresh machine passes what CI passes."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in block.strip().splitlines()]
    assert len(commands) == 2, "the quick start is two commands: run, test"
    ci_lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert commands[1] in ci_lines, f".ci/run does not run the README's {commands[1]!r}"
