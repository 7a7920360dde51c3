"""`verifiers:<taskset id>` environments: named in the registry, refused with the command to
run when their venv is missing, and (slow: with the real verifiers package in a venv of its
own) their prompts, held-out split and episodes, whose rewards come from the task's rubric
and whose tokens are exactly those the server returned.

The slow tests make the venv once (`cache_dir()/envs/verifiers-tests`, kept between
sessions; pip needs the package registry, else they are skipped) and use the taskset in
`verifiers_tasks/vf_reverse.py`. The run against the real vLLM server is in
tests/orchestrator/test_verifiers_with_vllm.py.
"""

from __future__ import annotations

import difflib
import json
import threading
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.envs.conftest import TASKS
from workbench.cli import app
from workbench.config import SamplingParams
from workbench.envs import (
    EnvironmentConfigError,
    environment_class,
    get_environment,
    verifiers_venv,
)
from workbench.envs.episode import Episode
from workbench.envs.external import ExternalEpisodeError, ExternalEpisodes
from workbench.envs.verifiers_env import VerifiersEnvironment
from workbench.files.endpoint import Endpoint
from workbench.orchestrator.episodes import run_episodes

# ---------------------------------------------------------------- without verifiers


def test_a_verifiers_name_is_a_class_of_its_own_per_taskset():
    reverse = environment_class("verifiers:vf-reverse")
    assert issubclass(reverse, VerifiersEnvironment)
    assert issubclass(reverse, ExternalEpisodes)
    assert reverse.name == "verifiers:vf-reverse"
    assert reverse.taskset_id == "vf-reverse"
    assert environment_class("verifiers:vf-reverse") is reverse
    assert environment_class("verifiers:other") is not reverse
    assert reverse.path_args == ("path",)


def test_without_its_venv_a_verifiers_environment_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv(verifiers_venv.VENV_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(EnvironmentConfigError) as err:
        get_environment("verifiers:vf-reverse")
    assert "workbench env install verifiers" in str(err.value)
    assert str(tmp_path / "nowhere") in str(err.value)
    assert "is not installed" in str(err.value)
    (tmp_path / "nowhere").mkdir()  # a venv whose install never finished
    with pytest.raises(EnvironmentConfigError, match="did not finish installing"):
        get_environment("verifiers:vf-reverse")


def test_unknown_env_args_are_refused_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.setenv(verifiers_venv.VENV_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(EnvironmentConfigError, match="unknown env_args key 'num_tasks'"):
        get_environment("verifiers:vf-reverse", num_tasks=3)
    with pytest.raises(EnvironmentConfigError, match=r"env_args\.eval_fraction"):
        get_environment("verifiers:vf-reverse", eval_fraction=1.5)


def test_run_episodes_hands_an_external_environment_the_endpoint_and_the_sampling():
    class Standin(VerifiersEnvironment):
        def __init__(self):  # no process: the test plays the environment
            self.calls = []

        def run_episodes(self, endpoint, prompts, seeds, *, model, n, sampling):
            self.calls.append(
                (endpoint, prompts, seeds, {"model": model, "n": n, **asdict(sampling)})
            )
            return [[Episode(prompt_ids=[1], token_ids=[2], logprobs=[-0.1], mask=[True])]]

    class Client:
        endpoint = Endpoint("http://127.0.0.1:1/v1", "key", "base")

        def chat(self, *args, **kwargs):
            raise AssertionError("an external environment generates its own episodes")

    env = Standin()
    groups = run_episodes(
        Client(), env, ["prompt"], [5], model="run@step1", n=1,
        sampling=SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9),
    )  # fmt: skip
    assert groups[0][0].token_ids == [2]
    ((endpoint, prompts, seeds, sampling),) = env.calls
    assert endpoint is Client.endpoint and prompts == ["prompt"] and seeds == [5]
    assert sampling == {
        "model": "run@step1",
        "n": 1,
        "max_tokens": 8,
        "temperature": 1.0,
        "top_p": 0.9,
    }


def test_env_install_makes_the_venv_with_the_packages_given(tmp_path, monkeypatch):
    calls = []

    def install(*, python, requirements, say):
        calls.append((python, requirements))
        venv = tmp_path / "venv"
        venv.mkdir()
        marker = {"verifiers": "0.4.0", "with": requirements}
        (venv / verifiers_venv.MARKER).write_text(json.dumps(marker))
        return venv

    monkeypatch.setattr(verifiers_venv, "install", install)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_env").mkdir()
    runner = CliRunner()
    result = runner.invoke(
        app, ["env", "install", "verifiers", "--python", "python3.12", "--with", "my_env"]
    )
    assert result.exit_code == 0, result.output
    # A folder that exists is given to pip by its absolute path.
    assert calls == [("python3.12", [str(tmp_path / "my_env")])]
    assert "verifiers 0.4.0 in" in result.output and "with " in result.output
    result = runner.invoke(app, ["env", "install", "nothing"])
    assert result.exit_code == 2 and "unknown kind 'nothing'" in result.output


def verifiers_recipe(tmp_path: Path) -> str:
    from tests.supervisor.test_preflight import recipe_text

    return recipe_text(tmp_path).replace(
        'env = "reverse_text"\nenv_args = { min_length = 9, max_length = 9 }',
        f'env = "verifiers:vf_reverse"\nenv_args = {{ path = "{TASKS}", taskset = {{ num_tasks = 30 }}, '
        'eval_taskset = { split = "test", num_tasks = 6 } }\neval.num_prompts = 6',
    )


def test_up_refuses_a_verifiers_run_without_the_venv_naming_the_command(tmp_path, monkeypatch):
    from tests.supervisor.test_preflight import problems

    monkeypatch.setenv(verifiers_venv.VENV_ENV, str(tmp_path / "nowhere"))
    line, message = problems(tmp_path, verifiers_recipe(tmp_path))["defaults.env_args"]
    assert line == 17 and "`workbench env install verifiers`" in message


def test_sft_refuses_a_verifiers_environment_with_the_reason():
    from pydantic import ValidationError

    from workbench.trainer.sft.train import SFTConfig

    with pytest.raises(ValidationError, match="no reference answers to learn"):
        SFTConfig(env="verifiers:vf_reverse", output_dir="/tmp/x", model="builtin:tiny-reverse")


# ---------------------------------------------------------------- with verifiers


def reverse_env(**env_args) -> VerifiersEnvironment:
    return get_environment("verifiers:vf_reverse", path=str(TASKS), **env_args)


@pytest.mark.slow
def test_prompts_and_the_eval_split_come_from_the_taskset(verifiers_python):
    env = reverse_env(taskset={"num_tasks": 30}, eval_taskset={"split": "test", "num_tasks": 6})
    try:
        assert env.split_sizes == {"train": 30, "eval": 6}
        train = env.sample_prompts(60, seed=3)  # two passes over the 30 tasks
        evals = env.sample_prompts(6, seed=3, split="eval")
        assert all(3 <= len(p.question) <= 6 for p in train), "the train split's texts"
        assert all(len(p.question) in (7, 8) for p in evals), "the test split's texts"
        assert len({p.question for p in evals}) == 6
        assert all(p.answer == p.question[::-1] for p in train + evals), "the task's answer"
        assert train[0].messages == [{"role": "user", "content": train[0].question}]
        assert train[0].env == "verifiers:vf_reverse" and train[0].split == "train"
        # Each pass covers every task once, shuffled anew; the stream is a pure function.
        first, second = train[:30], train[30:]
        assert sorted(p.info["row"] for p in first) == list(range(30))
        assert [p.info["row"] for p in first] != [p.info["row"] for p in second]
        assert [p.question for p in env.sample_prompts(5, seed=3, start=30)] == [
            p.question for p in second[:5]
        ]
    finally:
        env.close()

    held = reverse_env(taskset={"num_tasks": 40}, eval_fraction=0.25, system_prompt="Reverse it.")
    try:
        sizes = held.split_sizes
        assert sizes["train"] + sizes["eval"] == 40 and 0 < sizes["eval"] < 20
        train = {p.question for p in held.sample_prompts(sizes["train"])}
        evals = {p.question for p in held.sample_prompts(sizes["eval"], split="eval")}
        assert not train & evals, "held-out tasks never come up in training"
        prompt = held.prompt(0)
        assert prompt.messages[0] == {"role": "system", "content": "Reverse it."}
    finally:
        held.close()


@pytest.mark.slow
def test_a_taskset_verifiers_cannot_load_is_refused_with_its_reason(verifiers_python):
    with pytest.raises(EnvironmentConfigError) as err:
        get_environment("verifiers:no_such_taskset")
    assert "no_such_taskset" in str(err.value) and "not found" in str(err.value)
    with pytest.raises(EnvironmentConfigError, match="num_taskz"):
        reverse_env(taskset={"num_taskz": 3})


class OpenAIStandin:
    """An OpenAI-compatible chat server that answers like vLLM with `return_token_ids`:
    the reply's token ids are its characters' codes, the prompt's those of the last user
    message. Choice `i` of a request (`n` of them) answers the reversal, but only its first
    `(seed + i) % 4 + 2` characters, so episodes of one prompt score differently."""

    def __init__(self, refused: str | None = None) -> None:
        self.requests: list[dict] = []
        self.refused = refused  # a text whose turns get an error, not a reply
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                standin.requests.append(
                    {**body, "authorization": self.headers.get("Authorization"), "path": self.path}
                )
                text = body["messages"][-1]["content"]
                if text == standin.refused:
                    self.send_error(500, "the model is down")
                    return
                replies = [text[::-1][: (body["seed"] + i) % 4 + 2] for i in range(body["n"])]
                answer = {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body["model"],
                    "prompt_token_ids": [1, *[ord(c) for c in text], 2],
                    "choices": [
                        {
                            "index": number,
                            "message": {"role": "assistant", "content": reply},
                            "finish_reason": "length" if len(reply) < len(text) else "stop",
                            "token_ids": [ord(c) for c in reply],
                            "logprobs": {
                                "content": [
                                    {"token": c, "logprob": -0.25 * (i + 1), "top_logprobs": []}
                                    for i, c in enumerate(reply)
                                ]
                            },
                        }
                        for number, reply in enumerate(replies)
                    ],
                    "usage": {
                        "prompt_tokens": len(text) + 2,
                        "completion_tokens": sum(len(reply) for reply in replies),
                        "total_tokens": len(text) + 2 + sum(len(reply) for reply in replies),
                    },
                }
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = Endpoint(
            f"http://127.0.0.1:{self.http.server_address[1]}/v1", "the-key", "base"
        )
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.mark.slow
def test_episodes_run_against_the_server_and_take_the_rubrics_rewards(verifiers_python):
    import psutil

    server = OpenAIStandin()
    env = reverse_env(taskset={"num_tasks": 12}, eval_fraction=0.2)
    try:
        prompts = env.sample_prompts(2, seed=1)
        groups = env.run_episodes(
            server.endpoint,
            prompts,
            [11, 12],
            model="run_x@step3",
            n=3,
            sampling=SamplingParams(max_tokens=5, temperature=0.8, top_p=0.9),
        )
        # The episodes ran in the environment's process: it started no program for them
        # (a finished child's CPU time would be counted here).
        times = psutil.Process(env.server.process.pid).cpu_times()
        assert times.children_user + times.children_system == 0
    finally:
        env.close()
        server.close()

    assert [len(group) for group in groups] == [3, 3]
    requests = server.requests
    # The first turns of one prompt's episodes go out together, as one request for 3
    # choices (they may come apart when the machine is slow: never more than one each).
    assert sum(r["n"] for r in requests) == 6 and len(requests) < 6
    assert {r["model"] for r in requests} == {"run_x@step3"}, "the run's adapter name"
    assert {r["authorization"] for r in requests} == {"Bearer the-key"}, "the experiment's key"
    assert {r["path"] for r in requests} == {"/v1/chat/completions"}
    assert all(r["return_token_ids"] is True and r["logprobs"] is True for r in requests)
    # ... with the sampled tokens' log-probs as numbers only (no token decoded for them).
    assert all(r["vllm_xargs"] == {"workbench_logprobs": "ids"} for r in requests)
    assert {(r["temperature"], r["top_p"], r["max_tokens"]) for r in requests} == {(0.8, 0.9, 5)}

    rewards = []
    for prompt, group in zip(prompts, groups, strict=True):
        text = prompt.question
        for episode in group:
            (reply,) = episode.replies
            assert text[::-1].startswith(reply)
            # The rubric: similarity (weight 1) and exactness (weight 0.5).
            expected = difflib.SequenceMatcher(None, reply, prompt.answer).ratio()
            expected += 0.5 * (reply == prompt.answer)
            assert episode.reward == pytest.approx(expected)
            rewards.append(episode.reward)
            # The tokens exactly as the server returned them, the reply's trained.
            assert episode.prompt_ids == [1, *[ord(c) for c in text], 2]
            assert episode.token_ids == [ord(c) for c in reply]
            assert episode.mask == [True] * len(reply)
            assert episode.logprobs == pytest.approx([-0.25 * (i + 1) for i in range(len(reply))])
            assert episode.truncated == (len(reply) < len(text))
            assert episode.transcript() == reply
    assert len(set(rewards)) > 1, "episodes of one prompt score differently"


@pytest.mark.slow
def test_an_episodes_folder_is_made_when_its_task_uses_it_and_removed_after(
    verifiers_python, tmp_path, monkeypatch
):
    # verifiers keeps its runtimes' folders under ~/.cache/verifiers: a home of the test's.
    monkeypatch.setenv("HOME", str(tmp_path))
    folders = tmp_path / ".cache" / "verifiers" / "runtimes" / "subprocess"
    server = OpenAIStandin()
    sampling = SamplingParams(max_tokens=5)
    plain = reverse_env(taskset={"num_tasks": 12}, eval_fraction=0.2)
    files = get_environment(
        "verifiers:vf_files", path=str(TASKS), taskset={"num_tasks": 6}, eval_fraction=0.2
    )
    try:
        # The caches of verifiers_speedups.py are all in place for the pinned release.
        assert len(plain.server.ready["speedups"]) == 4, plain.server.ready
        groups = plain.run_episodes(
            server.endpoint,
            plain.sample_prompts(2, seed=1),
            [1, 2],
            model="m",
            n=3,
            sampling=sampling,
        )
        assert [len(group) for group in groups] == [3, 3]
        assert not folders.exists(), "an episode that runs no program makes no folder"

        groups = files.run_episodes(
            server.endpoint,
            files.sample_prompts(2, seed=1),
            [1, 2],
            model="m",
            n=3,
            sampling=sampling,
        )
        # Each task's setup ran a program in its episode's folder, and its reward read
        # what the program wrote there.
        assert [[episode.reward for episode in group] for group in groups] == [[1.0] * 3] * 2
        assert folders.is_dir() and not list(folders.iterdir()), "each folder was removed"
    finally:
        plain.close()
        files.close()
        server.close()


@pytest.mark.slow
def test_an_episode_that_fails_is_left_out_and_a_call_whose_every_episode_fails_raises(
    verifiers_python,
):
    env = reverse_env(taskset={"num_tasks": 12}, eval_fraction=0.2)
    prompts = env.sample_prompts(2, seed=1)
    server = OpenAIStandin(refused=prompts[0].question)
    sampling = SamplingParams(max_tokens=5)
    try:
        groups = env.run_episodes(
            server.endpoint, prompts, [11, 12], model="m", n=3, sampling=sampling
        )
        assert [len(group) for group in groups] == [0, 3], "the failed prompt's are left out"
        with pytest.raises(ExternalEpisodeError, match="500"):
            env.run_episodes(server.endpoint, prompts[:1], [11], model="m", n=2, sampling=sampling)
    finally:
        env.close()
        server.close()


@pytest.mark.slow
def test_up_measures_a_verifiers_runs_prompts_and_leaves_no_process(verifiers_python, tmp_path):
    import psutil

    from workbench.up import read_recipe

    path = tmp_path / "recipe.toml"
    path.write_text(verifiers_recipe(tmp_path))
    _, recipe = read_recipe(path)
    assert {c.env for c in recipe.run_configs().values()} == {"verifiers:vf_reverse"}
    # Every environment preflight built has ended its process.
    servers = [
        child
        for child in psutil.Process().children(recursive=True)
        if "verifiers_server.py" in " ".join(child.cmdline())
    ]
    assert not servers


@pytest.mark.slow
def test_the_shipped_verifiers_recipe_passes_every_check(verifiers_python):
    from workbench.up import read_recipe

    recipe = Path(__file__).parents[2] / "recipes" / "verifiers_reverse_text.toml"
    _, loaded = read_recipe(recipe)
    configs = loaded.run_configs().values()
    assert {c.env for c in configs} == {"verifiers:vf_reverse_text"}


@pytest.mark.slow
def test_the_environments_process_ends_with_it(verifiers_python):
    import gc

    env = reverse_env(taskset={"num_tasks": 5})
    process = env.server.process
    assert process.poll() is None
    del env
    gc.collect()
    assert process.wait(timeout=30) == 0, "dropped, the environment ends its process"

    env = reverse_env(taskset={"num_tasks": 5})
    env.close()
    assert env.server.process.returncode == 0
    with pytest.raises(RuntimeError, match="has ended"):
        env.prompt(0)
