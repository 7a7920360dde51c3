"""The verifiers venv holds the verifiers and pydantic releases the environment's process
was written and tested against: pinned at install, another verifiers refused by the process
(naming both versions) unless WORKBENCH_ALLOW_UNTESTED_VERIFIERS=1, and the caches of
`verifiers_speedups.py` put in place on the tested releases only; the runtime whose folder
is made on first use starts as verifiers' own runtime does.

The slow tests use the verifiers tests' venv (`conftest.py`)."""

from __future__ import annotations

import difflib
import json
import logging
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

from tests.envs.conftest import TASKS
from tests.envs.test_verifiers_env import OpenAIStandin
from workbench.config import SamplingParams
from workbench.envs import EnvironmentConfigError, get_environment, verifiers_venv
from workbench.envs.verifiers_versions import (
    ALLOW_UNTESTED_ENV,
    TESTED,
    release_problem,
    untested,
)

ROOT = Path(__file__).resolve().parents[2]
ENVS = ROOT / "workbench" / "envs"


def constraint_pins() -> dict[str, str]:
    lines = verifiers_venv.CONSTRAINTS.read_text().splitlines()
    pairs = (line.split("==", 1) for line in lines if "==" in line and not line.startswith("#"))
    return {package.lower().replace("_", "-"): version for package, version in pairs}


# ---------------------------------------------------------------- without verifiers


def test_the_venv_is_installed_with_the_tested_releases_and_the_constraints(monkeypatch):
    monkeypatch.delenv(verifiers_venv.NO_CONSTRAINTS_ENV, raising=False)
    arguments = verifiers_venv.pip_install_arguments(["my-env"])
    assert f"verifiers=={TESTED['verifiers']}" in arguments
    assert f"pydantic=={TESTED['pydantic']}" in arguments
    assert arguments[:2] == ["--constraint", str(verifiers_venv.CONSTRAINTS)]
    assert arguments[-2:] == ["uv", "my-env"]
    # The constraints hold the same releases, and every other package of the venv.
    pins = constraint_pins()
    assert pins["verifiers"] == TESTED["verifiers"] and pins["pydantic"] == TESTED["pydantic"]
    assert {"openai", "pydantic-core", "uv", "aiohttp"} <= pins.keys()
    # Refreshing them: the newest versions, but verifiers stays the release the code is for.
    monkeypatch.setenv(verifiers_venv.NO_CONSTRAINTS_ENV, "1")
    assert verifiers_venv.pip_install_arguments() == [f"verifiers=={TESTED['verifiers']}", "uv"]


def test_another_release_is_refused_naming_both_versions_unless_allowed(monkeypatch):
    # Read from the real metadata of a package this venv has: pydantic.
    installed = metadata.version("pydantic")
    monkeypatch.delenv(ALLOW_UNTESTED_ENV, raising=False)
    monkeypatch.setitem(TESTED, "pydantic", installed)
    assert release_problem("pydantic") is None and untested("pydantic") is None

    monkeypatch.setitem(TESTED, "pydantic", "2.0.1")
    problem = release_problem("pydantic")
    assert problem is not None
    assert f"pydantic {installed} is installed" in problem
    assert "tested against pydantic 2.0.1" in problem
    assert f"{ALLOW_UNTESTED_ENV}=1" in problem and "workbench env install verifiers" in problem
    assert untested("pydantic") == f"pydantic {installed} is installed, not the tested 2.0.1"

    monkeypatch.setenv(ALLOW_UNTESTED_ENV, "1")
    assert release_problem("pydantic") is None
    # The caches do not follow the override: they stay off another release.
    assert untested("pydantic") is not None


# ---------------------------------------------------------------- with verifiers


@pytest.mark.slow
def test_the_venv_the_install_made_has_the_tested_releases(verifiers_python):
    venv = verifiers_python.parent.parent
    assert verifiers_venv.installed_versions(venv) == TESTED
    marker = verifiers_venv.installed(venv) or {}
    assert {name: marker.get(name) for name in TESTED} == TESTED


def other_releases(tmp_path: Path) -> Path:
    """The test tasksets' folder, with metadata that names verifiers and pydantic 9.9.9:
    a stand-in for other releases (on PYTHONPATH, found before the venv's own), as the
    process reads them; the code run is still the tested releases'."""
    folder = tmp_path / "other-releases"
    shutil.copytree(TASKS, folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("verifiers", "pydantic"):
        info = folder / f"{name}-9.9.9.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 9.9.9\n")
    return folder


@pytest.mark.slow
def test_another_verifiers_is_refused_and_when_allowed_runs_without_the_caches(
    verifiers_python, tmp_path, monkeypatch, caplog
):
    path = str(other_releases(tmp_path))
    monkeypatch.delenv(ALLOW_UNTESTED_ENV, raising=False)
    with pytest.raises(EnvironmentConfigError) as err:
        get_environment("verifiers:vf_reverse", path=path, taskset={"num_tasks": 12})
    message = str(err.value)
    assert "verifiers 9.9.9 is installed" in message, message
    assert f"tested against verifiers {TESTED['verifiers']}" in message
    assert f"{ALLOW_UNTESTED_ENV}=1" in message

    monkeypatch.setenv(ALLOW_UNTESTED_ENV, "1")
    caplog.set_level(logging.INFO, logger="workbench.envs.verifiers_env")
    server = OpenAIStandin()
    env = get_environment(
        "verifiers:vf_reverse", path=path, taskset={"num_tasks": 12}, eval_fraction=0.2
    )
    try:
        assert env.server.ready["speedups"] == [], "no cache on a release it was not tested on"
        prompts = env.sample_prompts(2, seed=1)
        groups = env.run_episodes(
            server.endpoint,
            prompts,
            [11, 12],
            model="m",
            n=3,
            sampling=SamplingParams(max_tokens=5),
        )
    finally:
        env.close()
        server.close()
    logged = "\n".join(record.getMessage() for record in caplog.records)
    for name in ("verifiers", "pydantic"):
        assert f"{name} 9.9.9 is installed, not the tested {TESTED[name]}" in logged, logged
    # Still correct without the caches: the rubric's rewards of the replies.
    assert [len(group) for group in groups] == [3, 3]
    for prompt, group in zip(prompts, groups, strict=True):
        for episode in group:
            (reply,) = episode.replies
            expected = difflib.SequenceMatcher(None, reply, prompt.answer).ratio()
            expected += 0.5 * (reply == prompt.answer)
            assert episode.reward == pytest.approx(expected)


# Run in the verifiers venv: verifiers' own subprocess runtime and the one whose folder is
# made on first use, started under one name in turn; prints what each start left.
FOLDER_SCRIPT = r"""
import asyncio, json
from verifiers.v1 import runtimes
from verifiers.v1.runtimes.subprocess import SubprocessConfig, SubprocessRuntime
import verifiers_speedups

# Whatever verifiers' start sets is kept, this too (as a later start might set more).
library_start = SubprocessRuntime.start
async def start_that_sets_more(self):
    await library_start(self)
    self.set_by_start = "verifiers"
SubprocessRuntime.start = start_that_sets_more

assert "subprocess runtime folders made on first use" in verifiers_speedups.apply()
Ours = runtimes.SubprocessRuntime
assert Ours is not SubprocessRuntime

def state(runtime):
    names = sorted(k for k in vars(runtime) if not k.startswith("workbench_"))
    return {"names": names, "workdir": [type(runtime.workdir).__name__, str(runtime.workdir)],
            "info": runtime.info.model_dump(), "set_by_start": runtime.set_by_start}

async def refused(runtime, use):
    try:
        await runtime.start()
        await use(runtime)
    except FileExistsError:
        return True
    finally:
        await runtime.stop()
    return False

async def main():
    report = {}
    own = SubprocessRuntime(SubprocessConfig(), name="one")
    await own.start()
    report["own"], report["own_made"] = state(own), own.workdir.is_dir()
    await own.stop()
    ours = Ours(SubprocessConfig(), name="one")
    await ours.start()
    report["ours"], report["ours_made"] = state(ours), ours.workdir.is_dir()
    report["pwd"] = (await ours.run(["pwd"], {})).stdout.strip()
    report["made_on_use"] = ours.workdir.is_dir()
    folder = ours.workdir
    await ours.stop()
    report["removed"] = not folder.is_dir()
    # A folder already there: verifiers' start refuses it, and so does the first use.
    # (A runtime's stop removes its folder, made or found: the folder is made anew.)
    (folder.parent / "taken").mkdir(parents=True)
    report["own_refuses"] = await refused(SubprocessRuntime(SubprocessConfig(), "taken"), None)
    (folder.parent / "taken").mkdir(parents=True, exist_ok=True)
    ran = lambda runtime: runtime.run(["true"], {})
    report["ours_refuses"] = await refused(Ours(SubprocessConfig(), "taken"), ran)
    print(json.dumps(report))

asyncio.run(main())
"""


@pytest.mark.slow
def test_the_folder_on_first_use_runtime_starts_as_verifiers_own_does(verifiers_python, tmp_path):
    environment = verifiers_venv.server_environment(path=str(ENVS))
    environment["HOME"] = str(tmp_path)  # verifiers keeps its runtimes' folders there
    result = subprocess.run(
        [str(verifiers_python), "-c", FOLDER_SCRIPT],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["ours"] == report["own"], "the same state as verifiers' own start leaves"
    assert report["own"]["workdir"][0] == "PosixPath"
    assert report["own_made"] and not report["ours_made"], "the folder waits for its use"
    assert report["made_on_use"] and report["pwd"] == report["own"]["workdir"][1]
    assert report["removed"]
    assert report["own_refuses"] and report["ours_refuses"], report
