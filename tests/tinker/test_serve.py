"""`workbench serve`: its key and bind checks (nothing written or started on a refusal), and
the supervisor's plan running the service as a process of the experiment."""

from __future__ import annotations

import stat
import sys

import pytest
from typer.testing import CliRunner

from workbench.cli import app
from workbench.supervisor.tinker_service import (
    API_KEY_ENV,
    ServiceFile,
    read_service_file,
    service_file_path,
    service_spec,
    write_service_file,
)
from workbench.tinker.app import adam_params

RECIPE = """
[experiment]
name = "served"
output_dir = "{out}"
[model]
base = "builtin:tiny-reverse"
[[runs]]
id = "run_a"
"""


def test_beyond_loopback_without_a_key_is_refused_before_anything_is_written(tmp_path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE.format(out=tmp_path / "out"))
    result = CliRunner().invoke(
        app, ["serve", str(recipe), "--host", "0.0.0.0"], env={API_KEY_ENV: ""}
    )
    assert result.exit_code == 2
    assert "give a key too" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("key", ["sk-0123456789abcdefghijkl", "tml-short"])
def test_a_key_the_sdk_would_refuse_or_too_short_is_refused(tmp_path, key):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE.format(out=tmp_path / "out"))
    result = CliRunner().invoke(app, ["serve", str(recipe), "--api-key", key])
    assert result.exit_code == 2 and "tml-" in result.output
    assert not (tmp_path / "out").exists()


def test_the_plan_runs_the_service_with_its_key_in_the_environment(tmp_path):
    assert service_spec(tmp_path) is None  # `workbench up` alone: no service
    key = "tml-0123456789abcdefghij"
    write_service_file(tmp_path, ServiceFile(host="0.0.0.0", port=8799, api_key=key))
    assert stat.S_IMODE(service_file_path(tmp_path).stat().st_mode) == 0o600
    assert read_service_file(tmp_path).api_key == key
    spec = service_spec(tmp_path)
    assert spec.name == "tinker"
    assert spec.argv == [
        sys.executable,
        "-m",
        "workbench.tinker",
        str(tmp_path),
        "--host",
        "0.0.0.0",
        "--port",
        "8799",
    ]
    assert key not in " ".join(spec.argv) and spec.env["WORKBENCH_TINKER_API_KEY"] == key
    assert spec.readiness.url == "http://127.0.0.1:8799/api/v1/healthz"


def test_optim_step_takes_the_sdks_learning_rate():
    # The SDK's AdamParams says `learning_rate`; the work item's says `lr`.
    adam = adam_params({"learning_rate": 3e-3, "beta1": 0.8, "grad_clip_norm": 1.0})
    assert (adam.lr, adam.beta1, adam.grad_clip_norm) == (3e-3, 0.8, 1.0)
