"""`verifiers:<taskset id>`: an environment written with verifiers (PyPI `verifiers`, v1 API).

    env = "verifiers:reverse-text"
    env_args = { taskset = { num_tasks = 200 }, eval_taskset = { split = "test" } }

The taskset id is the one verifiers loads (`vf.load_taskset`): an installed package in the
verifiers venv (`workbench env install verifiers --with PACKAGE`), or a module in
`env_args.path`. Its tasks are the prompts; each episode runs in verifiers, its harness
playing the task against the run's vLLM server under the run's adapter name with the
experiment's API key, and its reward is the sum of the task's weighted rewards.

verifiers cannot live in workbench's venv (it pins openai below 3; vLLM needs 3.57), so it
runs in a process of its own started from its own venv: `verifiers_server.py` (the
protocol and how the episode's tokens stay exact are described there). One process per
environment object, started when the environment is built and ended with it (or when this
process ends: it reads its requests from our pipe).

Prompts: the tasks are read once, when the process starts; prompt `i` of a `(seed, split)`
stream is task `order[i % n]` of the split, `order` a permutation seeded by (seed, split,
i // n), as for the `dataset` environment, so a resumed run replays exactly the tasks that
would have come next. The eval split is the tasks of `eval_taskset` (the taskset's keys
with these over them, e.g. its own `split` key), or else a held-out share of the tasks
(`eval_fraction`, chosen by a hash of each task's key with `split_seed`).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import logging
import subprocess
import threading
import weakref
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from workbench.envs import splits, verifiers_venv
from workbench.envs.base import EnvArgs, Environment, EnvironmentConfigError, Prompt, Task
from workbench.envs.dataset import shuffled_order
from workbench.envs.external import ExternalEpisodeError, ExternalEpisodes

if TYPE_CHECKING:
    from workbench.config import SamplingParams
    from workbench.envs.episode import Episode
    from workbench.files.endpoint import Endpoint

logger = logging.getLogger(__name__)

PREFIX = "verifiers:"
# Importing verifiers and reading a taskset (a dataset download, say) can take a while.
STARTUP_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 60.0  # a task lookup; episodes take as long as they take
STDERR_LINES_KEPT = 40


class VerifiersArgs(EnvArgs):
    taskset: dict[str, Any] = Field(
        default_factory=dict,
        description="the taskset's config: its own keys (verifiers' --env.taskset.*), e.g. "
        "{ num_tasks = 200 }",
    )
    eval_taskset: dict[str, Any] | None = Field(
        None,
        description="keys over `taskset` whose tasks are the eval split, e.g. { split = "
        '"test" }; without it a held-out share of the tasks is (eval_fraction)',
    )
    eval_fraction: float = Field(
        0.05, gt=0, lt=1, description="without eval_taskset: the share of tasks held out"
    )
    split_seed: int = Field(0, description="seeds which tasks eval_fraction holds out")
    max_tasks: int | None = Field(
        None, ge=1, description="read at most this many tasks (a taskset without end needs it)"
    )
    harness: str | None = Field(
        None,
        description="the harness that plays each episode (verifiers' harness id); default "
        "the taskset's own, else `workbench-chat`, verifiers' tool-less chat loop run in the "
        "environment's process (`null` runs it as a program per episode)",
    )
    agent: dict[str, Any] = Field(
        default_factory=dict,
        description="more of the agent's config (verifiers' --env.agent.*), e.g. { max_turns "
        "= 4 }; it runs in a local subprocess unless `runtime` says otherwise",
    )
    env: dict[str, Any] = Field(
        default_factory=dict,
        description="more of verifiers' [env] table: `id` pairs a multi-agent env with the "
        "taskset, `timeout`, `retries`",
    )
    path: str | None = Field(
        None,
        description="a folder to import the environment's module from, when it is not a "
        "package installed in the verifiers venv; relative to the recipe's folder",
    )
    max_concurrent: int = Field(
        256,
        ge=1,
        description="episodes in flight at once in the environment's process (a step's "
        "episodes all at once by default; lower it for a harness that starts a program per "
        "episode)",
    )


class VerifiersEnvironment(ExternalEpisodes, Environment):
    """A verifiers taskset: its tasks are the prompts, its episodes run in its own process."""

    name: ClassVar[str] = PREFIX
    taskset_id: ClassVar[str] = ""
    Args = VerifiersArgs
    args: VerifiersArgs
    path_args = ("path",)

    def __init__(self, args: VerifiersArgs | None = None) -> None:
        super().__init__(args)
        if not self.taskset_id:
            raise EnvironmentConfigError(
                f"name the verifiers taskset after the prefix: env = '{PREFIX}<taskset id>'"
            )
        problem = verifiers_venv.missing_problem()
        if problem is not None:
            raise EnvironmentConfigError(f"environment {self.name!r}: {problem}")
        self.server = EnvironmentServer(self.server_config(), path=self.args.path)
        try:
            self.split_sizes = self.server.start()
        except EnvironmentServerError as err:
            self.server.close()
            raise EnvironmentConfigError(f"environment {self.name!r}: {err}") from None
        self._tasks: dict[tuple[str, int], Task] = {}
        self._warned_branches = False

    def server_config(self) -> dict[str, Any]:
        args = self.args
        return {
            "taskset_id": self.taskset_id,
            "taskset": args.taskset,
            "eval_taskset": args.eval_taskset,
            "eval_fraction": args.eval_fraction,
            "split_seed": args.split_seed,
            "max_tasks": args.max_tasks,
            "harness": args.harness,
            "agent": args.agent,
            "env": args.env,
            "system_prompt": args.system_prompt,
            "max_concurrent": args.max_concurrent,
        }

    def close(self) -> None:
        """End the environment's process (it also ends when this process does)."""
        self.server.close()

    # ------------------------------------------------------------ the prompts

    @property
    def system_prompt(self) -> str | None:
        # A task carries its own system prompt, in its messages (env_args.system_prompt
        # replaces it there).
        return None

    def task_at(self, index: int, *, seed: int, split: str) -> Task:
        count = self.split_sizes[split]
        if not count:
            raise EnvironmentConfigError(self._empty_split(split))
        epoch, offset = divmod(index, count)
        row = shuffled_order(count, f"verifiers|{split}|{seed}|{epoch}")[offset]
        key = (split, row)
        if key not in self._tasks:
            (view,) = self.server.request("tasks", split=split, rows=[row])["tasks"]
            self._tasks[key] = Task(
                question=view["question"],
                answer=view["answer"],
                info={"split": split, "row": row, "key": view["key"]},
                chat=view["messages"],
            )
        return self._tasks[key]

    def _empty_split(self, split: str) -> str:
        if split == splits.TRAIN:
            return f"every task of taskset {self.taskset_id!r} is held out for eval"
        return (
            f"env_args.eval_fraction = {self.args.eval_fraction} holds out none of the "
            f"{self.split_sizes[splits.TRAIN]} tasks of taskset {self.taskset_id!r}; raise it, "
            "or give eval_taskset"
        )

    # ------------------------------------------------------------ the episodes

    def run_episodes(
        self,
        endpoint: Endpoint,
        prompts: list[Prompt],
        seeds: list[int],
        *,
        model: str,
        n: int,
        sampling: SamplingParams,
    ) -> list[list[Episode]]:
        """Each prompt's episodes, less those that ended before the model answered (its
        harness failed, say); `ExternalEpisodeError` when none is left."""
        pending = [
            self.server.submit(
                "run",
                split=prompt.split,
                row=prompt.info["row"],
                n=n,
                model=model,
                base_url=endpoint.base_url,
                api_key=endpoint.api_key,
                sampling=dataclasses.asdict(sampling),
                # Each episode samples with a seed of its own, fixed by the prompt's.
                seeds=[(seed * 1_000_003 + number * 101) % 2**31 for number in range(n)],
            )
            for prompt, seed in zip(prompts, seeds, strict=True)
        ]
        groups: list[list[Episode]] = []
        failures: list[str] = []
        for prompt, future in zip(prompts, pending, strict=True):
            try:
                records = self.server.answer(future)["episodes"]
            except EnvironmentServerError as err:  # the whole request: no episode of it
                records = [{"error": str(err)}] * n
            group = []
            for record in records:
                if "error" in record:
                    failures.append(f"{prompt.question[:60]!r}: {record['error']}")
                else:
                    group.append(self._episode_of(record))
            groups.append(group)
        if failures:
            # Dropped from their groups (the orchestrator counts them in the step's
            # metrics); the first reasons here.
            logger.warning(
                "%s: %d of %d episodes ended before the model answered, dropped: %s",
                self.name,
                len(failures),
                len(prompts) * n,
                "; ".join(failures[:3]),
            )
        if len(failures) == len(prompts) * n:
            raise ExternalEpisodeError(f"{self.name}: {failures[0]}")
        return groups

    def _episode_of(self, record: dict[str, Any]) -> Episode:
        """One episode the process sent back, that the model answered in."""
        from workbench.envs.episode import Episode

        if record["branches"] > 1 and not self._warned_branches:
            self._warned_branches = True
            logger.warning(
                "%s: an episode's later turns did not extend the tokens of its earlier "
                "ones (%d branches: the chat template re-renders earlier turns, or a "
                "reply re-tokenised differently); it trains on its last branch, where "
                "the earlier replies are prompt",
                self.name,
                record["branches"],
            )
        return Episode(
            prompt_ids=record["prompt_ids"],
            token_ids=record["token_ids"],
            logprobs=record["logprobs"],
            mask=record["mask"],
            replies=record["replies"],
            env_messages=record["env_messages"],
            truncated=record["truncated"],
            done=True,
            reward=record["reward"],
        )

    # ------------------------------------------------------------ scoring text alone

    def parse_answer(self, completion: str) -> str | None:
        return completion

    def score(self, parsed_answer: str | None, prompt: Prompt) -> float:
        raise EnvironmentConfigError(
            f"{self.name} scores whole episodes in verifiers (its task's rewards), not a "
            "completion's text"
        )


@cache
def verifiers_environment_class(taskset_id: str) -> type[VerifiersEnvironment]:
    """The environment class for `verifiers:<taskset_id>` (one per id, so its name is the
    run's `env`)."""
    return type(
        "VerifiersEnvironment",
        (VerifiersEnvironment,),
        {"name": PREFIX + taskset_id, "taskset_id": taskset_id, "__module__": __name__},
    )


# ---------------------------------------------------------------- the process


class EnvironmentServerError(RuntimeError):
    """The environment's process failed to start, or ended, or refused a request."""


class EnvironmentServer:
    """One `verifiers_server.py` process and the requests in flight to it (thread-safe:
    the orchestrator's training step and its background eval share it). The process ends
    with `close`, or once this object is garbage (its reader threads hold only the
    `_Connection`), or with this process (it reads its requests from our pipe)."""

    def __init__(self, config: dict[str, Any], *, path: str | None = None) -> None:
        self.config = config
        self.path = path
        self._connection: _Connection | None = None
        self._finalizer: weakref.finalize | None = None
        self.ready: dict[str, Any] = {}  # the process's first line, once started

    def start(self, timeout_s: float = STARTUP_TIMEOUT_S) -> dict[str, int]:
        """Start the process; returns the number of tasks in each split."""
        python = verifiers_venv.venv_python()
        process = subprocess.Popen(
            [str(python), str(verifiers_venv.SERVER_SCRIPT), "--config", json.dumps(self.config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            env=verifiers_venv.server_environment(path=self.path),
        )
        self._finalizer = weakref.finalize(self, _stop, process)
        self._connection = connection = _Connection(process)
        try:
            ready = connection.ready.result(timeout=timeout_s)
        except FutureTimeout:
            raise EnvironmentServerError(
                f"its process did not start within {timeout_s:.0f} s{connection.stderr_tail()}"
            ) from None
        if "error" in ready:
            raise EnvironmentServerError(f"verifiers could not load it: {ready['error']}")
        self.ready = ready
        return {split: int(ready["splits"][split]) for split in splits.SPLITS}

    @property
    def process(self) -> subprocess.Popen | None:
        return None if self._connection is None else self._connection.process

    def submit(self, op: str, **fields: Any) -> Future:
        """Send a request; its future holds the answer."""
        if self._connection is None:
            raise EnvironmentServerError("its process was never started")
        return self._connection.submit(op, fields)

    def answer(self, future: Future, timeout_s: float | None = None) -> dict[str, Any]:
        answer = future.result(timeout=timeout_s)
        if "error" in answer:
            raise EnvironmentServerError(answer["error"])
        return answer

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        return self.answer(self.submit(op, **fields), REQUEST_TIMEOUT_S)

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()


class _Connection:
    """The pipes of one process: requests out, answers matched to their futures by id."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.ready: Future = Future()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._pending: dict[int, Future] = {}
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES_KEPT)
        threading.Thread(target=self._read_answers, name="verifiers-out", daemon=True).start()
        threading.Thread(target=self._read_stderr, name="verifiers-err", daemon=True).start()

    def submit(self, op: str, fields: dict[str, Any]) -> Future:
        future: Future = Future()
        with self._lock:
            if self.process.poll() is not None:
                raise EnvironmentServerError(f"its process has ended{self.stderr_tail()}")
            number = next(self._ids)
            self._pending[number] = future
            assert self.process.stdin is not None
            try:
                self.process.stdin.write(json.dumps({"id": number, "op": op, **fields}) + "\n")
                self.process.stdin.flush()
            except (OSError, ValueError) as err:  # ValueError: closed by `close`
                self._pending.pop(number, None)
                raise EnvironmentServerError(
                    f"its process stopped reading ({err}){self.stderr_tail()}"
                ) from None
        return future

    def _read_answers(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                logger.warning("verifiers environment process wrote %r", line[:200])
                continue
            if not self.ready.done():
                self.ready.set_result(message)
                continue
            with self._lock:
                future = self._pending.pop(message.get("id"), None)
            if future is not None:
                future.set_result(message)
        code = self.process.wait()
        error = EnvironmentServerError(f"its process exited with status {code}{self.stderr_tail()}")
        if not self.ready.done():
            self.ready.set_exception(error)
        with self._lock:
            pending, self._pending = self._pending, {}
        for future in pending.values():
            future.set_exception(error)

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            line = line.rstrip()
            self._stderr.append(line)
            logger.info("verifiers: %s", line)

    def stderr_tail(self) -> str:
        lines = list(self._stderr)[-12:]
        return (":\n" + "\n".join(lines)) if lines else ""


def _stop(process: subprocess.Popen) -> None:
    """Close the process's requests (it exits when they end); kill it if it lingers."""
    try:
        if process.stdin is not None:
            process.stdin.close()
    except OSError:
        pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
