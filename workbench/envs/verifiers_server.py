"""The process that runs a verifiers environment for one workbench environment object.

Run by `workbench.envs.verifiers_env` with the python of the verifiers venv
(`workbench env install verifiers`), never imported by workbench: it imports only the
standard library, verifiers and what verifiers brings (aiohttp). verifiers pins an openai
release that vLLM's cannot share a venv with, hence a process and a venv of its own.

    python verifiers_server.py --config JSON     serve one environment (below)
    python verifiers_server.py --warm            prepare what the first episode needs

The protocol is JSON lines: requests on stdin, answers on stdout (the process's own
prints go to stderr). The first line out is `{"ready": true, "splits": {"train": N,
"eval": M}, "speedups": [...], ...}` (the caches `verifiers_speedups.py` put in place),
or `{"error": ...}` before it exits 1 (also when the installed verifiers is not the release
`verifiers_versions.py` names, unless WORKBENCH_ALLOW_UNTESTED_VERIFIERS=1). Then each
request `{"id", "op", ...}` gets one answer `{"id", ...}` or `{"id", "error"}`, in any
order:

- `{"op": "tasks", "split", "rows": [...]}` -> `{"tasks": [{"messages", "question",
  "answer", "key"}]}`: the split's tasks at those row numbers;
- `{"op": "run", "split", "row", "n", "model", "base_url", "api_key", "sampling": {...},
  "seeds": [...]}` -> `{"episodes": [...]}`: `n` episodes of the task, each against the
  OpenAI-compatible server at `base_url` with `model` (each with its own sampling seed).

Each episode is one sample: `prompt_ids`, `token_ids`, `logprobs`, `mask` (True on the
tokens the model sampled), `replies`, `env_messages`, `truncated`, `reward` (the sum of
the rubric's weighted rewards), `rewards` (each by name), `branches` and `errors`.

Where the tokens come from: the environment's harness talks to verifiers' interception
server, which asks a model client for each turn. Here that client is `TokenClient`: it
sends the turn to `/chat/completions` with `return_token_ids` and `logprobs` (vLLM's
extensions), and hands verifiers the prompt's token ids as vLLM rendered them and the
completion's ids as sampled, with their log-probs. verifiers keeps them per message in
the episode's trace graph; a path of the graph (a branch) is a token sequence the model
saw exactly. When a later turn's prompt does not extend the earlier turns' tokens (the
chat template re-renders them, or a sampled reply re-tokenises differently), the graph
splits into branches: the episode is then its last branch, on which the earlier replies
are prompt tokens (no loss) as the model saw them in that turn. Nothing is re-tokenised
on this side.

When stdin closes (its workbench process ended), the process exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hashlib
import json
import logging
import os
import sys
import threading
import traceback
from asyncio import FIRST_COMPLETED
from typing import Any

SPLITS = ("train", "eval")
PROTOCOL = 1

logger = logging.getLogger("workbench.verifiers_server")


# ---------------------------------------------------------------- the model client


def _install_token_client() -> None:
    """Make verifiers' interception server use `TokenClient` for a train-client config.

    The interception server builds its model clients with `resolve_client`; a train-client
    config (`TrainClientConfig`) is also what makes it ask the client for whole responses
    rather than relay streams. verifiers' own train client renders prompts itself and needs
    vLLM's generate endpoint; ours lets vLLM render, as the rest of workbench does.
    """
    import verifiers.v1 as vf
    from verifiers.v1.interception import server as interception_server

    if not hasattr(interception_server, "resolve_client"):
        raise RuntimeError(
            "this verifiers release builds its model clients differently from 0.4; "
            "reinstall the venv: workbench env install verifiers"
        )
    token_client = _token_client_class()
    resolve = interception_server.resolve_client

    def resolve_client(config: Any) -> Any:
        if isinstance(config, vf.TrainClientConfig):
            return token_client(config)
        return resolve(config)

    interception_server.resolve_client = resolve_client


def _token_client_class() -> type:
    """`TokenClient`, a verifiers model client; made here because verifiers is imported
    only once the process serves an environment."""
    import aiohttp
    from verifiers.v1.clients.client import Client
    from verifiers.v1.dialects import ChatDialect
    from verifiers.v1.errors import model_error
    from verifiers.v1.types import TurnTokens

    class TokenClient(Client):
        """Each turn through vLLM's chat completions, with the token ids and log-probs."""

        def __init__(self, config: Any) -> None:
            self.url = config.base_url.rstrip("/") + "/chat/completions"
            self.headers = dict(config.headers)
            self._http: aiohttp.ClientSession | None = None

        @property
        def http(self) -> aiohttp.ClientSession:
            # Made on first use, in the server's event loop. aiohttp, not httpx: with a
            # step's episodes all in flight, httpx's pool scans every connection for each
            # request, a good share of an episode's CPU.
            if self._http is None:
                self._http = aiohttp.ClientSession(
                    headers=self.headers,
                    timeout=aiohttp.ClientTimeout(total=None, connect=30.0),
                    # vLLM drops a connection idle for 5 s: do not reuse one that old.
                    connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0),
                )
            return self._http

        async def get_response(
            self, dialect, body, sampling, session_id=None, turn=None, headers=None
        ):
            if not isinstance(dialect, ChatDialect):
                raise NotImplementedError(
                    f"workbench trains on chat-completions turns only; this harness spoke "
                    f"{type(dialect).__name__}"
                )
            raw = await FIRST_TURNS.complete(
                session_id,
                _turn_request(body),
                lambda request: _post_turn(self.http, self.url, request),
            )
            prompt_ids, ids, logprobs = _take_token_fields(raw)
            if prompt_ids is None or ids is None:
                raise model_error(
                    "the server returned no token ids: it must be vLLM (return_token_ids)",
                    status_code=502,
                )
            # A reply's log-probs can be one short of its ids (a stop token vLLM gave no
            # log-prob): the ids without one are not the model's to train on.
            kept = min(len(ids), len(logprobs))
            response = dialect.parse_response(dialect.validate_response(raw))
            response.tokens = TurnTokens(
                prompt_ids=list(prompt_ids),
                completion_ids=ids[:kept],
                completion_logprobs=logprobs[:kept],
            )
            response.raw = raw
            return response

        async def close(self) -> None:
            if self._http is not None:
                await self._http.close()

    return TokenClient


def _turn_request(body: dict[str, Any]) -> dict[str, Any]:
    """A harness's turn as one unstreamed choice with vLLM's token ids and the sampled
    tokens' log-probs."""
    request = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    request.pop("top_logprobs", None)
    request.update(n=1, logprobs=True, return_token_ids=True, return_tokens_as_token_ids=True)
    # Log-probs without token strings (`workbench.inference.token_id_logprobs`, which this
    # process cannot import: it runs in verifiers' venv).
    request["vllm_xargs"] = {**(request.get("vllm_xargs") or {}), "workbench_logprobs": "ids"}
    return request


async def _post_turn(http: Any, url: str, request: dict[str, Any]) -> dict[str, Any]:
    """vLLM's chat completion of one turn; a failed request is verifiers' model error."""
    import aiohttp
    from verifiers.v1.errors import model_error

    try:
        async with http.post(url, json=request) as answer:
            status, text = answer.status, await answer.text()
    except (aiohttp.ClientError, OSError) as err:
        raise model_error(f"{type(err).__name__}: {err}", status_code=503) from err
    if status != 200:
        raise model_error(f"upstream {status}: {text[:500]}", status_code=status)
    return json.loads(text)


class FirstTurns:
    """The first turns of one task's episodes (a `run` request's `n`), sent as one request
    for `n` choices: vLLM then reads the prompt once and answers one request, not one per
    episode (on a CPU, most of a step's time went to those requests). Each episode gets
    one choice, with its own token ids and log-probs; the request samples with the first
    episode's seed (vLLM draws each choice independently). Only turns alike but for their
    seed go together; later turns, and an episode that joins its group after it went out (a
    retry, one the `max_concurrent` bound held back), are sent alone. A group waits for the
    first turn of each episode that has started, at most `WAIT_S` after its first (an
    episode may fail before it asks anything)."""

    WAIT_S = 1.0

    def __init__(self) -> None:
        self.members: dict[str, TurnGroup] = {}  # trace id -> its episode's group

    def join(self, trace_id: str, group: TurnGroup) -> None:
        if not group.sent:
            group.started += 1
            self.members[trace_id] = group

    def leave(self, trace_ids: list[str]) -> None:
        for trace_id in trace_ids:
            self.members.pop(trace_id, None)

    async def complete(
        self, trace_id: str | None, request: dict[str, Any], post: Any
    ) -> dict[str, Any]:
        """The chat completion of `request` (one choice), sent by `post`."""
        group = self.members.pop(trace_id, None) if trace_id is not None else None
        if group is None or group.sent:
            return await post(request)
        return await group.add(request, post)


class TurnGroup:
    """The first turns of one `run` request's episodes, until they go out."""

    def __init__(self) -> None:
        self.started = 0  # episodes that joined it
        self.arrived = 0
        self.sent = False
        self.out = asyncio.Event()  # set once its turns went out
        self.waiting: dict[str, list[tuple[dict[str, Any], asyncio.Future]]] = {}
        self.post: Any = None

    async def add(self, request: dict[str, Any], post: Any) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        key = json.dumps({k: v for k, v in request.items() if k != "seed"}, sort_keys=True)
        answer: asyncio.Future = loop.create_future()
        self.waiting.setdefault(key, []).append((request, answer))
        self.post = self.post or post
        self.arrived += 1
        if self.arrived >= self.started:
            self.send()
        elif self.arrived == 1:
            loop.call_later(FirstTurns.WAIT_S, self.send)
        return await answer

    def send(self) -> None:
        if self.sent:
            return
        self.sent = True
        self.out.set()
        for batch in self.waiting.values():
            task = asyncio.ensure_future(_send_batch(batch, self.post))
            _SENDING.add(task)  # kept until done: the loop holds tasks only weakly
            task.add_done_callback(_SENDING.discard)
        self.waiting = {}


FIRST_TURNS = FirstTurns()
_SENDING: set[asyncio.Future] = set()


async def _send_batch(batch: list[tuple[dict[str, Any], asyncio.Future]], post: Any) -> None:
    """One request for the batch's turns, a choice each."""
    batch = [item for item in batch if not item[1].done()]
    if not batch:
        return
    try:
        raw = await post({**batch[0][0], "n": len(batch)})
        sent = len(raw.get("choices") or [])
        if sent != len(batch):
            raise RuntimeError(f"asked for {len(batch)} choices, the server sent {sent}")
    except Exception as err:  # each turn of the batch fails with it
        for _, answer in batch:
            if not answer.done():
                answer.set_exception(err)
        return
    for number, (_, answer) in enumerate(batch):
        if not answer.done():
            answer.set_result(_one_choice(raw, number))


def _one_choice(raw: dict[str, Any], number: int) -> dict[str, Any]:
    """Choice `number` of a completion as a completion of its own (usage counted for it)."""
    choice = {**raw["choices"][number], "index": 0}
    one = {**raw, "choices": [choice]}
    usage = raw.get("usage")
    if usage and choice.get("token_ids") is not None:
        prompt = usage.get("prompt_tokens", 0)
        completion = len(choice["token_ids"])
        one["usage"] = {
            **usage,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
    return one


def _take_token_fields(raw: dict[str, Any]) -> tuple[Any, list[int] | None, list[float]]:
    """The prompt's token ids, the first choice's token ids (None when vLLM sent none) and
    its log-probs, taken out of a chat completion so that verifiers parses a plain one."""
    choice = raw["choices"][0]
    content = (choice.get("logprobs") or {}).get("content") or []
    logprobs = [float(item["logprob"]) for item in content]
    token_ids = choice.get("token_ids")
    ids = None if token_ids is None else list(token_ids)
    prompt_ids = raw.get("prompt_token_ids")
    for key in ("prompt_token_ids", "prompt_logprobs", "kv_transfer_params"):
        raw.pop(key, None)
    for item in raw["choices"]:
        item.pop("token_ids", None)
        item.pop("logprobs", None)
    return prompt_ids, ids, logprobs


# ---------------------------------------------------------------- the environment


def _register_chat_harness() -> str:
    """Make `workbench-chat` (`verifiers_chat.py`, beside this script) a harness id that
    verifiers can load: it imports a harness id as a module of that name."""
    import verifiers_chat

    sys.modules.setdefault(verifiers_chat.MODULE_NAME, verifiers_chat)
    # verifiers looks a harness id up in its own harness package first, on every episode:
    # there, the lookup is a dictionary's, not a search of the package's folder.
    sys.modules.setdefault(f"verifiers.v1.harnesses.{verifiers_chat.MODULE_NAME}", verifiers_chat)
    return verifiers_chat.HARNESS_ID


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _held_out(split_seed: int, key: str, fraction: float) -> bool:
    # As workbench's dataset environment holds rows out: by a hash of the task's identity.
    digest = hashlib.blake2b(f"{split_seed}|{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") < fraction * 2**64


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    from verifiers.v1.types import content_text

    return content_text(content)


class Served:
    """The environment(s) of one configuration and the tasks of each split."""

    def __init__(self, config: dict[str, Any]) -> None:
        import verifiers.v1 as vf

        self.vf = vf
        self.config = config
        taskset_id = config["taskset_id"]
        chat = _register_chat_harness()
        self.harness = config.get("harness") or vf.default_harness_id(taskset_id)
        if self.harness == "bash" and not config.get("harness"):
            # A taskset without a harness of its own gets the tool-less chat loop, not a
            # shell on this machine; run in this process, not as a program per episode.
            self.harness = chat
        train_env = self._environment(config.get("taskset") or {})
        tasks = self._tasks(train_env, "env_args.taskset")
        eval_args = config.get("eval_taskset")
        if eval_args is not None:
            eval_env = self._environment(_merge(config.get("taskset") or {}, eval_args))
            self.splits = {
                "train": (train_env, tasks),
                "eval": (eval_env, self._tasks(eval_env, "env_args.eval_taskset")),
            }
        else:
            fraction, seed = config["eval_fraction"], config["split_seed"]
            held = [_held_out(seed, task.key, fraction) for task in tasks]
            self.splits = {
                "train": (train_env, [t for t, h in zip(tasks, held, strict=True) if not h]),
                "eval": (train_env, [t for t, h in zip(tasks, held, strict=True) if h]),
            }
        self.gate = asyncio.Semaphore(config.get("max_concurrent") or 256)
        # Episodes played in this process start one task's at a time (below, `run`).
        self.starting = asyncio.Lock() if self.harness == chat else None

    def _environment(self, taskset_args: dict[str, Any]) -> Any:
        vf, config = self.vf, self.config
        raw = _merge(
            config.get("env") or {}, {"taskset": {**taskset_args, "id": config["taskset_id"]}}
        )
        if not raw.get("id"):  # the single-agent env: its one agent plays
            agent = {"harness": {"id": self.harness}, "runtime": {"type": "subprocess"}}
            raw["agent"] = _merge(agent, config.get("agent") or {})
        return vf.load_environment(vf.resolve_env_config(raw))

    def _tasks(self, env: Any, key: str) -> list[Any]:
        taskset, limit = env.taskset, self.config.get("max_tasks")
        if limit is not None:
            taskset = taskset.take(limit)
        elif not taskset.bounded:
            raise ValueError(
                f"taskset {self.config['taskset_id']!r} never ends: set env_args.max_tasks "
                "to the number of its tasks to use"
            )
        tasks = list(taskset)
        system_prompt = self.config.get("system_prompt")
        if system_prompt is not None:
            tasks = [task.with_data(system_prompt=system_prompt or None) for task in tasks]
        if not tasks:
            raise ValueError(f"taskset {self.config['taskset_id']!r} ({key}) has no tasks")
        return tasks

    def sizes(self) -> dict[str, int]:
        return {split: len(tasks) for split, (_, tasks) in self.splits.items()}

    def environments(self) -> list[Any]:
        unique: dict[int, Any] = {}
        for env, _ in self.splits.values():
            unique[id(env)] = env
        return list(unique.values())

    # ------------------------------------------------------------ requests

    def task_view(self, split: str, row: int) -> dict[str, Any]:
        task = self.splits[split][1][row]
        data = task.data
        messages: list[dict[str, str]] = []
        if data.system_prompt:
            messages.append({"role": "system", "content": data.system_prompt})
        if isinstance(data.prompt, str):
            messages.append({"role": "user", "content": data.prompt})
        else:
            for message in data.prompt or []:
                messages.append({"role": message.role, "content": _text(message.content)})
        users = [m["content"] for m in messages if m["role"] == "user"]
        answer = getattr(data, "answer", None)
        return {
            "messages": messages,
            "question": users[-1] if users else data.prompt_text,
            "answer": "" if answer is None or isinstance(answer, dict | list) else str(answer),
            "key": task.key,
        }

    async def run(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        vf = self.vf
        env, tasks = self.splits[request["split"]]
        task = tasks[request["row"]]
        client = vf.TrainClientConfig(
            base_url=request["base_url"],
            api_key_var="WORKBENCH_VERIFIERS_API_KEY",
            headers={"Authorization": f"Bearer {request['api_key']}"},
        )
        slots = env.slots(task, request["n"])
        group, traces = TurnGroup(), []

        def minted(trace: Any) -> None:
            traces.append(trace.id)
            FIRST_TURNS.join(trace.id, group)

        async def one(slot: Any, seed: int) -> Any:
            sampling = vf.Sampling(**request["sampling"], seed=seed)
            context = vf.ModelContext(model=request["model"], client=client, sampling=sampling)
            return await env.run_slot(slot, context, self.gate, on_trace=minted)

        episodes: list[asyncio.Future] = []
        try:
            async with self.starting or contextlib.nullcontext():
                episodes = [
                    asyncio.ensure_future(one(slot, seed))
                    for slot, seed in zip(slots, request["seeds"], strict=True)
                ]
                if self.starting is not None:
                    await _first_turns_out(group, episodes)
            done = await asyncio.gather(*episodes)
        finally:
            for episode in episodes:
                episode.cancel()  # nothing when it has ended
            FIRST_TURNS.leave(traces)
        return [episode_record(episode) for episode in done]


STARTING_WAIT_S = 0.2


async def _first_turns_out(group: TurnGroup, episodes: list[asyncio.Future]) -> None:
    """Until the group's first turns went to vLLM, its episodes all ended, or
    `STARTING_WAIT_S` passed. With `workbench-chat` an episode's start (its agent, runtime,
    interception slot: a few milliseconds of CPU) happens in this process: when a step's
    tasks all start at once, the event loop takes them through their starts side by side,
    and vLLM gets its first request only once every episode has started. One task's at a
    time, vLLM generates the first task's turns while the next ones start."""
    out = asyncio.ensure_future(group.out.wait())
    ended = asyncio.gather(*episodes, return_exceptions=True)
    try:
        await asyncio.wait({out, ended}, timeout=STARTING_WAIT_S, return_when=FIRST_COMPLETED)
    finally:
        out.cancel()


def episode_record(episode: Any) -> dict[str, Any]:
    """One episode as one sample: the last branch of its first trainable trace."""
    from verifiers.v1.types import AssistantMessage

    errors = [error.message for error in episode.errors]
    traces = [trace for trace in episode.traces if trace.agent.trainable]
    for trace in traces:
        errors += [error.message for error in trace.errors]
    record: dict[str, Any] = {"errors": errors, "traces": len(traces)}
    trace = traces[0] if traces else None
    branches = [b for b in trace.branches if b.trainable and any(b.sampled_mask)] if trace else []
    if not branches:
        record["error"] = "; ".join(errors) or "the model was never asked"
        return record
    branch = branches[-1]
    ids, mask, logprobs = branch.token_ids, branch.sampled_mask, branch.logprobs
    first = mask.index(True)
    replies: list[str] = []
    between: list[list[str]] = []
    seen = 0
    for node in branch.nodes:
        size = len(node.token_ids)
        starts_after_prompt = seen + size > first
        seen += size
        if not starts_after_prompt:
            continue
        if node.sampled and isinstance(node.message, AssistantMessage):
            replies.append(node.message.content or "")
            between.append([])
        elif between:
            between[-1].append(_text(node.message.content))
    rewards = {
        name: None if reward is None else reward.value for name, reward in trace.rewards.items()
    }
    record.update(
        prompt_ids=ids[:first],
        token_ids=ids[first:],
        logprobs=logprobs[first:],
        mask=mask[first:],
        replies=replies,
        env_messages=["\n".join(texts) for texts in between if texts],
        # An episode cut short by an error (its context outgrew the server's, say) keeps
        # the turns it had, counted as truncated.
        truncated=bool(trace.is_truncated or errors),
        reward=float(trace.reward),
        rewards=rewards,
        branches=len(trace.branches),
    )
    return record


# ---------------------------------------------------------------- serving


class Channel:
    """The JSON-lines channel: stdin in (a reader thread), the original stdout out."""

    def __init__(self) -> None:
        # Whatever verifiers or a library prints must not land in the protocol.
        self.out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def send(self, message: dict[str, Any]) -> None:
        self.out.write(json.dumps(message) + "\n")
        self.out.flush()

    def start_reading(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> None:
        def read() -> None:
            for line in sys.stdin:
                if line.strip():
                    loop.call_soon_threadsafe(queue.put_nowait, line)
            loop.call_soon_threadsafe(queue.put_nowait, None)

        threading.Thread(target=read, name="stdin", daemon=True).start()


async def serve(config: dict[str, Any], channel: Channel) -> int:
    import verifiers_versions

    # Another verifiers release is refused before it is imported, naming both versions.
    problem = verifiers_versions.release_problem("verifiers")
    if problem is not None:
        channel.send({"error": problem})
        return 1
    import verifiers
    import verifiers_speedups

    try:
        _install_token_client()
        served = Served(config)
        speedups = verifiers_speedups.apply()
    except Exception as err:  # the workbench side shows it as the env_args' problem
        logger.debug("cannot build the environment", exc_info=True)
        channel.send({"error": f"{type(err).__name__}: {err}"})
        return 1
    queue: asyncio.Queue = asyncio.Queue()
    channel.start_reading(asyncio.get_running_loop(), queue)
    running: set[asyncio.Task] = set()

    async with contextlib.AsyncExitStack() as stack:
        for env in served.environments():
            await stack.enter_async_context(env.serving())
        # What is loaded by now (verifiers, pydantic, aiohttp, the tasks: some 400,000
        # objects) lives as long as the process: kept out of the collector's full passes,
        # which otherwise scanned it all a few times a step (a sixth of the episodes' CPU).
        gc.collect()
        gc.freeze()
        channel.send(
            {
                "ready": True,
                "protocol": PROTOCOL,
                "splits": served.sizes(),
                "harness": served.harness,
                "verifiers": verifiers.__version__,
                "speedups": speedups,
            }
        )
        while (line := await queue.get()) is not None:
            task = asyncio.create_task(_answer(served, json.loads(line), channel))
            running.add(task)
            task.add_done_callback(running.discard)
        for task in running:
            task.cancel()
    return 0


async def _answer(served: Served, request: dict[str, Any], channel: Channel) -> None:
    """One request answered on the channel: its tasks, its episodes, or why it failed."""
    answer: dict[str, Any] = {"id": request.get("id")}
    try:
        if request.get("op") == "tasks":
            answer["tasks"] = [served.task_view(request["split"], r) for r in request["rows"]]
        elif request.get("op") == "run":
            answer["episodes"] = await served.run(request)
        else:
            answer["error"] = f"unknown op {request.get('op')!r}"
    except Exception as err:
        logger.warning("request %s failed:\n%s", request.get("op"), traceback.format_exc())
        answer["error"] = f"{type(err).__name__}: {err}"
    channel.send(answer)


async def warm() -> int:
    """Prepare the chat program the tool-less harness runs for each episode (a uv script:
    uv resolves and caches its packages), so that episodes start without a download."""
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE
    from verifiers.v1.runtimes import SubprocessConfig, provision_runtime

    async with provision_runtime(SubprocessConfig()) as runtime:
        await runtime.prepare_uv_script(CHAT_PROGRAM_SOURCE, {})
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="the environment's configuration, as JSON")
    parser.add_argument("--warm", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(
        level=os.environ.get("WORKBENCH_VERIFIERS_LOG_LEVEL", "WARNING"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.warm:
        return asyncio.run(warm())
    channel = Channel()
    code = asyncio.run(serve(json.loads(args.config), channel))
    # Not a clean interpreter exit: threads of verifiers' runtimes may still wait on
    # programs that their stop already killed. Everything worth keeping is sent.
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
