"""An evicted Tinker run answers its client with a clear error: the real SDK against the
real service process, no trainer (so its forward_backward stays pending until the run is
evicted as `workbench evict` evicts it)."""

from __future__ import annotations

import pytest
import tinker

from tests.tinker.conftest import BUILTIN as BASE
from tests.tinker.conftest import SERVICE_RECIPE, datum, sdk_client, start_service
from workbench.files import run_control

API_KEY = "tml-workbench-eviction-0123456789"


@pytest.fixture
def service(tmp_path):
    (tmp_path / "recipe.toml").write_text(SERVICE_RECIPE)
    proc, url = start_service(tmp_path, API_KEY)
    yield url, tmp_path
    proc.terminate()
    proc.wait(10)


def test_an_evicted_run_fails_its_pending_and_later_requests_naming_the_eviction(service):
    url, experiment = service
    with sdk_client(url, API_KEY) as client:
        training = client.create_lora_training_client(base_model=BASE, rank=4).result(timeout=60)
        pending = training.forward_backward([datum()], "cross_entropy")
        (run,) = experiment.glob("run_tinker_*")
        run_control.evict(run, "too slow for this experiment", by="cli")
        with pytest.raises(Exception, match="was evicted by cli: too slow for this experiment"):
            pending.result(timeout=30)
        with pytest.raises(tinker.APIStatusError, match="was evicted") as later:
            training.forward_backward([datum()], "cross_entropy").result(timeout=30)
        assert later.value.status_code == 410
