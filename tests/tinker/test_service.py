"""The real tinker SDK (0.38.0) against the real service process on 127.0.0.1, with the
built-in model's recipe; no trainer runs here, so a forward_backward stays pending
(try-again) while its work item waits on disk, decoded as the client sent it."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker

from tests.tinker.conftest import BUILTIN as BASE
from tests.tinker.conftest import SERVICE_RECIPE, datum, sdk_client, start_service
from workbench.files import run_control
from workbench.files import tinker_work as tw

API_KEY = "tml-workbench-test-key-0123456789"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    experiment = tmp_path_factory.mktemp("exp")
    (experiment / "recipe.toml").write_text(SERVICE_RECIPE)
    # Longer than the SDK's heartbeat period (10 s): the module's clients keep their
    # sessions (with 4 s, the reaper ended them while tests still used them).
    proc, url = start_service(experiment, API_KEY, "--session-timeout", "60")
    yield url, experiment
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def short_sessions(tmp_path):
    """A service of its own whose sessions end 4 s after their last heartbeat."""
    (tmp_path / "recipe.toml").write_text(SERVICE_RECIPE)
    proc, url = start_service(tmp_path, API_KEY, "--session-timeout", "4")
    yield url, tmp_path
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def client(service):
    with sdk_client(service[0], API_KEY) as client:
        yield client


@pytest.fixture(scope="module")
def training(client):
    # 0.38 returns a future of the client (awaitable, or `.result()`).
    return client.create_lora_training_client(base_model=BASE, rank=4, seed=3).result(timeout=60)


def _raw(url, path, body, key=API_KEY, **kwargs):
    return httpx.post(f"{url}{path}", json=body, headers={"X-API-Key": key}, **kwargs)


def test_capabilities_name_the_served_base_model(client):
    capabilities = client.get_server_capabilities()
    assert [m.model_name for m in capabilities.supported_models] == [BASE]


def test_a_training_client_is_a_tinker_run_with_the_asked_rank(training, service):
    runs = list(service[1].glob("run_tinker_*"))
    assert len(runs) == 1
    orch = (runs[0] / "control" / "orch.toml").read_text()
    assert 'source = "tinker"' in orch and "rank = 4" in orch and "seed = 3" in orch
    info = training.get_info()
    assert info.model_data.model_name == BASE


def test_get_tokenizer_loads_the_built_in_tokenizer_offline(training, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = training.get_tokenizer()
    assert tokenizer.decode(tokenizer.encode("abc", add_special_tokens=False)) == "abc"


def test_forward_backward_writes_the_datums_the_client_sent_and_waits_for_the_trainer(
    training, service
):
    datums = [
        tinker.types.Datum(
            model_input=tinker.types.ModelInput.from_ints(list(range(5 + i))),
            loss_fn_inputs={
                "target_tokens": np.arange(1, 6 + i, dtype=np.int64),
                "weights": np.linspace(0, 1, 5 + i, dtype=np.float32),
            },
        )
        for i in range(2)
    ]
    future = training.forward_backward(datums, "cross_entropy")
    run = next(service[1].glob("run_tinker_*"))
    deadline = time.monotonic() + 20
    while not tw.pending_requests(run) and time.monotonic() < deadline:
        time.sleep(0.1)
    (item,) = tw.pending_requests(run)
    assert (item.request.op, item.request.loss_fn, item.request.num_datums) == (
        "forward_backward",
        "cross_entropy",
        2,
    )
    for i, written in enumerate(item.datums()):
        assert written["input_ids"].tolist() == list(range(5 + i))
        assert written["target_tokens"].tolist() == list(range(1, 6 + i))
        assert np.array_equal(written["weights"], np.linspace(0, 1, 5 + i, dtype=np.float32))
    # No trainer: the future is pending, the SDK keeps asking (try-again).
    with pytest.raises(TimeoutError):
        future.result(timeout=3)
    # A trainer's answer reaches the client as Tinker's ForwardBackwardOutput.
    tw.write_result(
        item,
        ok=True,
        metrics={"loss:sum": 2.5},
        tensors={f"d{i}.logprobs": np.full(5 + i, -0.25, np.float32) for i in range(2)},
    )
    output = future.result(timeout=30)
    assert output.metrics == {"loss:sum": 2.5}
    assert [o["logprobs"].tolist() for o in output.loss_fn_outputs] == [[-0.25] * 5, [-0.25] * 6]


def test_workbench_logs_of_a_tinker_run_shows_its_model_and_each_work_item(client, service):
    """A client's run has a log, read as any run's is: its model, then a line per item."""
    from typer.testing import CliRunner

    from workbench.cli import app

    experiment = service[1]
    before = set(experiment.glob("run_tinker_*"))
    training = client.create_lora_training_client(base_model=BASE, rank=3).result(timeout=60)
    (run,) = set(experiment.glob("run_tinker_*")) - before
    training.forward_backward([datum(), datum()], "cross_entropy")  # no trainer: pending
    item = re.compile(r"work item 1: forward_backward of 2 datums \(cross_entropy\)")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        shown = CliRunner().invoke(app, ["logs", run.name, "-e", str(experiment)])
        assert shown.exit_code == 0, shown.output
        lines = shown.output.splitlines()
        if any(item.search(line) for line in lines):
            break
        time.sleep(0.1)
    assert f"{run.name} model {training.model_id} (LoRA rank 3)" in lines[0], lines
    assert any(item.search(line) for line in lines), lines


def test_a_pending_request_answers_try_again(service):
    url, _ = service
    session = _raw(url, "/api/v1/create_session", {"tags": [], "sdk_version": "x"}).json()
    body = {
        "session_id": session["session_id"],
        "model_seq_id": 0,
        "base_model": BASE,
        "lora_config": {"rank": 2},
    }
    created = _raw(url, "/api/v1/create_model", body).json()
    model_id = _raw(url, "/api/v1/retrieve_future", created).json()["model_id"]
    step = _raw(
        url,
        "/api/v1/optim_step",
        {"model_id": model_id, "seq_id": 1, "adam_params": {"learning_rate": 1e-3}},
    ).json()
    again = _raw(url, "/api/v1/retrieve_future", step, timeout=30).json()
    assert again == {"type": "try_again", "request_id": step["request_id"], "queue_state": "active"}
    # A retry of the same seq_id is the same request, written once.
    retry = _raw(url, "/api/v1/optim_step", {"model_id": model_id, "seq_id": 1}).json()
    assert retry == step


def test_a_wrong_or_missing_key_is_refused_with_a_message(service):
    url, _ = service
    for key in ("tml-wrong", ""):
        answer = _raw(url, "/api/v1/create_session", {}, key=key)
        assert answer.status_code == 401 and "API key" in answer.json()["error"]
    with pytest.raises(Exception, match="API key"):
        tinker.ServiceClient(base_url=url, api_key="tml-wrong").get_server_capabilities()


def test_bad_bodies_and_unknown_models_get_a_4xx_with_a_message(service):
    url, _ = service
    headers = {"X-API-Key": API_KEY, "Content-Type": "application/x-protobuf"}
    garbage = httpx.post(
        f"{url}/api/v1/forward_backward", content=b"\xff\x00garbage", headers=headers
    )
    assert garbage.status_code == 400 and "protobuf" in garbage.json()["error"]
    import zstandard

    bomb = zstandard.ZstdCompressor().compress(b"\0" * (65 * 1024 * 1024))
    big = httpx.post(
        f"{url}/api/v1/forward_backward",
        content=bomb,
        headers={**headers, "Content-Encoding": "zstd"},
    )
    assert big.status_code == 413
    unknown = _raw(url, "/api/v1/get_info", {"model_id": "nope:train:0"})
    assert unknown.status_code == 404 and "unknown model id" in unknown.json()["error"]


def test_a_rank_above_the_trainers_slots_is_refused(client):
    with pytest.raises(Exception, match="rank 64"):
        client.create_lora_training_client(base_model=BASE, rank=64).result(timeout=60)


def test_heartbeats_keep_a_session_and_their_stop_ends_it_with_its_state_saved(short_sessions):
    url, experiment = short_sessions
    session = _raw(url, "/api/v1/create_session", {"tags": [], "sdk_version": "x"}).json()
    sid = session["session_id"]
    before = set(experiment.glob("run_tinker_*"))
    body = {"session_id": sid, "model_seq_id": 0, "base_model": BASE, "lora_config": {"rank": 2}}
    model_id = _raw(
        url, "/api/v1/retrieve_future", _raw(url, "/api/v1/create_model", body).json()
    ).json()["model_id"]
    for _ in range(4):
        time.sleep(1.5)
        assert _raw(url, "/api/v1/session_heartbeat", {"session_id": sid}).status_code == 200
    time.sleep(10)
    assert _raw(url, "/api/v1/session_heartbeat", {"session_id": sid}).status_code == 410
    (run,) = set(experiment.glob("run_tinker_*")) - before
    saves = [
        item
        for item in tw.pending_requests(run)
        if item.request.op == "save_state" and item.request.path.endswith("session_end")
    ]
    assert saves, model_id
    # Its slot goes back once the trainer has saved it, not before.
    (save,) = saves
    time.sleep(0.5)
    assert not run_control.is_finished(run)
    tw.write_result(save, ok=True)  # as the trainer answers it
    deadline = time.monotonic() + 10
    while not run_control.is_finished(run) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert run_control.is_finished(run)


def test_an_unloaded_model_gives_its_trainer_slot_back(client, service):
    url, experiment = service
    before = set(experiment.glob("run_tinker_*"))
    training = client.create_lora_training_client(base_model=BASE, rank=2, seed=5).result(
        timeout=60
    )
    (run,) = set(experiment.glob("run_tinker_*")) - before
    assert not run_control.is_finished(run)
    # The route the API has (this SDK release never calls it): raw, as other servers test it.
    unload = _raw(url, "/api/v1/unload_model", {"model_id": training.model_id})
    assert unload.status_code == 200
    deadline = time.monotonic() + 10
    while not run_control.is_finished(run) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert run_control.is_finished(run)


def test_a_stopping_service_has_the_trainer_save_every_live_model(tmp_path, request):
    """`workbench down` stops the service before the trainer: it writes a save_state work
    item for each model still in use and waits while the trainer answers them."""
    (tmp_path / "recipe.toml").write_text(SERVICE_RECIPE)
    # The supervisor's state as it is while the trainer runs (this process stands in for it).
    state = {"processes": {"trainer": {"pid": os.getpid()}}}
    (tmp_path / "supervisor").mkdir()
    (tmp_path / "supervisor" / "state.json").write_text(json.dumps(state))
    proc, url = start_service(tmp_path, API_KEY, "--session-timeout", "600")
    try:
        client = tinker.ServiceClient(base_url=url, api_key=API_KEY)
        # Its session outlives the service on purpose; at the end its heartbeats are
        # stopped without the finish a stopped service could not answer.
        request.addfinalizer(lambda: client._get_session_holder().close())
        client.create_lora_training_client(base_model=BASE, rank=2, seed=1).result(timeout=60)
        (run,) = tmp_path.glob("run_tinker_*")
        proc.terminate()
        deadline = time.monotonic() + 10
        while not (saves := tw.pending_requests(run)) and time.monotonic() < deadline:
            time.sleep(0.1)
        (save,) = saves
        assert save.request.op == "save_state" and save.request.with_optimizer
        assert Path(save.request.path).name.startswith("stopped-")
        time.sleep(1.0)
        assert proc.poll() is None, "it stopped before the trainer saved the model"
        tw.write_result(save, ok=True)  # as the trainer answers it
        # uvicorn ends a graceful stop by raising the SIGTERM it caught again.
        assert proc.wait(10) in (0, -signal.SIGTERM)
    finally:
        proc.kill()


def test_a_client_closed_ends_its_session_at_once_with_its_state_saved(service):
    """`with tinker.ServiceClient(...)` (or `close("success")`): the SDK finishes its session;
    its models' state is saved as `session_end`, the same as after a timeout, without the
    wait, and its heartbeats stop."""
    url, experiment = service
    before = set(experiment.glob("run_tinker_*"))
    with tinker.ServiceClient(base_url=url, api_key=API_KEY) as client:
        client.create_lora_training_client(base_model=BASE, rank=2).result(timeout=60)
        session_id = client._get_session_holder().get_session_id()  # the SDK's own record
    (run,) = set(experiment.glob("run_tinker_*")) - before
    deadline = time.monotonic() + 10
    saves = []
    while not saves and time.monotonic() < deadline:
        saves = [
            item
            for item in tw.pending_requests(run)
            if item.request.op == "save_state" and item.request.path.endswith("session_end")
        ]
        time.sleep(0.1)
    assert len(saves) == 1, "closed: its state saved once, without the 60 s timeout"
    beat = _raw(url, "/api/v1/session_heartbeat", {"session_id": session_id})
    assert beat.status_code == 410, beat.text
    again = _raw(url, f"/api/v1/sessions/{session_id}/finish", {"reason": {"type": "success"}})
    assert again.status_code == 200, "a second finish changes nothing"
    unknown = _raw(url, "/api/v1/sessions/session-nope/finish", {"reason": {"type": "success"}})
    assert unknown.status_code == 404 and "session-nope" in unknown.text


def _answer_save(run: Path, prefix: str, timeout: float = 10.0) -> tw.WorkItem:
    """Answer `run`'s pending save_state whose name starts with `prefix` as the trainer does:
    its directory written, then its result."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for item in tw.pending_requests(run):
            if item.request.op == "save_state" and Path(item.request.path).name.startswith(prefix):
                Path(item.request.path).mkdir(parents=True)
                tw.write_result(item, ok=True)
                return item
        time.sleep(0.1)
    raise AssertionError(f"no {prefix}* save_state item for {run.name}")


def test_a_service_started_again_knows_the_models_of_the_one_before(tmp_path, request):
    """The service dies with a model open (SIGKILL: no stop save). The one started again on
    the experiment saves that model's state as `restart-<time>` and gives its slot back; its
    `tinker://` path loads in a new training client; its old client hears 410 saying so."""
    (tmp_path / "recipe.toml").write_text(SERVICE_RECIPE)
    first, url = start_service(tmp_path, API_KEY)
    client = tinker.ServiceClient(base_url=url, api_key=API_KEY)
    request.addfinalizer(lambda: client._get_session_holder().close())  # its service dies
    old = client.create_lora_training_client(base_model=BASE, rank=2).result(timeout=60)
    (run,) = tmp_path.glob("run_tinker_*")
    first.kill()
    first.wait(10)

    # On the same port, as `workbench up` starts it again (supervisor/tinker.json).
    second, _ = start_service(tmp_path, API_KEY, port=int(url.rsplit(":", 1)[1]))
    try:
        save = _answer_save(run, "restart-")
        deadline = time.monotonic() + 10
        while not run_control.is_finished(run) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert run_control.is_finished(run), "its slot given back once saved"
        path = f"tinker://{old.model_id}/weights/{Path(save.request.path).name}"
        with sdk_client(url, API_KEY) as again:
            future = again.create_training_client_from_state(path)
            deadline = time.monotonic() + 30
            while len(list(tmp_path.glob("run_tinker_*"))) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            (new_run,) = set(tmp_path.glob("run_tinker_*")) - {run}
            (load,) = tw.pending_requests(new_run)
            assert (load.request.op, load.request.path) == ("load_state", save.request.path)
            tw.write_result(load, ok=True)
            assert future.result(timeout=60).get_info().lora_rank == 2
        with pytest.raises(tinker.APIStatusError, match="earlier run of this service") as gone:
            old.forward_backward([datum()], "cross_entropy").result(timeout=30)
        assert gone.value.status_code == 410
    finally:
        second.kill()
        second.wait(10)


def test_a_service_stopped_cleanly_finishes_the_models_it_saved(tmp_path, request):
    """`workbench down`: each live model's state saved, then its run finished, so that the
    next `up` gives it no slot and the next service saves nothing again."""
    (tmp_path / "recipe.toml").write_text(SERVICE_RECIPE)
    state = {"processes": {"trainer": {"pid": os.getpid()}}}  # a trainer to wait for
    (tmp_path / "supervisor").mkdir()
    (tmp_path / "supervisor" / "state.json").write_text(json.dumps(state))
    proc, url = start_service(tmp_path, API_KEY)
    client = tinker.ServiceClient(base_url=url, api_key=API_KEY)
    request.addfinalizer(lambda: client._get_session_holder().close())
    client.create_lora_training_client(base_model=BASE, rank=2).result(timeout=60)
    (run,) = tmp_path.glob("run_tinker_*")
    proc.terminate()
    _answer_save(run, "stopped-")
    assert proc.wait(10) in (0, -signal.SIGTERM)
    assert run_control.is_finished(run)
    again, _ = start_service(tmp_path, API_KEY)
    try:
        time.sleep(1.0)
        assert [item.request.op for item in tw.list_items(run)] == ["save_state"]
    finally:
        again.kill()
        again.wait(10)
