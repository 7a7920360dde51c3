"""`workbench-chat`: verifiers' tool-less chat loop (the `null` harness) run inside the
environment's process instead of as a program of its own per episode.

Imported only by `verifiers_server.py`, in the verifiers venv (it imports verifiers at the
top, as a verifiers harness plugin must; workbench's own venv never imports it).

verifiers' `null` harness starts, for every episode (and for every later user turn of one),
a uv script: a python that imports openai and mcp, seconds of CPU before its first request.
Its loop is verifiers' own code (`harnesses/utils/core.py`, with `compaction.py` and
`mcp.py` bundled into that script). This harness runs the very same bundled source, loaded
once per process, as a coroutine per episode: same requests to the episode's interception
endpoint (so the model client, the trace graph and the tokens are verifiers' as before),
same tool calls to the task's MCP servers, no process. verifiers allows this in so many
words: "the interception is the contract, not the process" (`Harness.launch`).
"""

from __future__ import annotations

import asyncio
import json
import traceback
import types
from contextlib import AsyncExitStack
from functools import cache
from typing import Any

from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.harnesses.null import NullHarness
from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE
from verifiers.v1.runtimes import ProgramResult

HARNESS_ID = "workbench-chat"
MODULE_NAME = "workbench_chat"  # what verifiers imports for the id above
MCP_CONNECT_TIMEOUT_S = 60.0  # as the chat program allows its tool servers


@cache
def chat_program() -> types.ModuleType:
    """The chat program's source as a module (its `__main__` entry point stays inert)."""
    module = types.ModuleType("workbench_chat_program")
    exec(compile(CHAT_PROGRAM_SOURCE, "<verifiers chat program>", "exec"), module.__dict__)
    return module


@cache
def shared_http() -> Any:
    """One httpx client for the chat program's SDK calls (episodes with tools): the
    interception server is local, and a client per episode would rebuild its TLS context
    each time."""
    import httpx

    return httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0))


_session: Any = None


def interception_session() -> Any:
    """One aiohttp session for the tool-less episodes' turns (made in the server's one
    event loop). aiohttp, not httpx: with a step's episodes all in flight, httpx's pool
    scans every connection for each request, a good share of an episode's CPU."""
    global _session
    if _session is None:
        import aiohttp

        _session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, connect=5.0),
            connector=aiohttp.TCPConnector(limit=0),
        )
    return _session


class WorkbenchChatHarness(NullHarness):
    """The `null` harness's loop as a coroutine: one per episode, no process."""

    async def setup(self, runtime: Any) -> None:
        """Nothing to prepare: the `null` harness prepares its uv script here."""

    async def launch(
        self,
        ctx: Any,
        trace: Any,
        runtime: Any,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: Any,
        tool_interception_url: str | None = None,
    ) -> ProgramResult:
        system_prompt, prompt = self.resolve_prompt(data)
        messages: list[dict] = (
            [{"role": "system", "content": system_prompt}] if system_prompt else []
        )
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt is not None:
            messages.extend(message_to_wire(message) for message in prompt)
        try:
            if mcp_urls or tool_interception_url:
                await self._chat(
                    ctx.model, endpoint, secret, mcp_urls, messages, tool_interception_url
                )
            else:
                await self._chat_without_tools(ctx.model, endpoint, secret, messages)
        except SystemExit as exit:  # the loop's way to say its model connection failed
            code = exit.code if isinstance(exit.code, int) else 1
            return ProgramResult(exit_code=code, stdout="", stderr=traceback.format_exc())
        except Exception:  # the program would have died with this traceback
            return ProgramResult(exit_code=1, stdout="", stderr=traceback.format_exc())
        return ProgramResult(exit_code=0, stdout="", stderr="")

    async def _chat_without_tools(
        self, model: str, endpoint: str, secret: str, messages: list[dict]
    ) -> None:
        """The chat program's loop where the model has no tools: one reply, as the program
        asks for it (its turn through the interception endpoint), unstreamed and without
        the OpenAI SDK's models around it (most of an episode's CPU here otherwise). As
        the program does, a context overflow ends the episode with what it has."""
        program = chat_program()
        url = endpoint.rstrip("/") + "/chat/completions"
        async with interception_session().post(
            url,
            headers={"Authorization": f"Bearer {secret}"},
            json={"model": model, "messages": messages},
        ) as answer:
            status, text = answer.status, await answer.text()
        if status != 200:
            import httpx

            response = httpx.Response(status, text=text, request=httpx.Request("POST", url))
            error = program.APIStatusError(text[:2000], response=response, body=_json_or_none(text))
            if program.is_context_overflow(error):
                return
            raise error

    async def _chat(
        self,
        model: str,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        messages: list[dict],
        tool_interception_url: str | None,
    ) -> None:
        """The chat program's `main` with its arguments given, not parsed."""
        program = chat_program()
        http = shared_http()
        client = program.AsyncOpenAI(base_url=endpoint, api_key=secret, http_client=http)
        args = types.SimpleNamespace(
            api_key=secret,
            tool_interception_url=tool_interception_url or "",
            bash=False,
            edit=False,
            search=False,
            serper_key="",
        )
        async with AsyncExitStack() as stack:
            tools, dispatch, servers = [], {}, {}
            if mcp_urls:
                config = {
                    "mcpServers": {
                        name: {"url": url, "timeout": self.config.tool_timeout}
                        for name, url in mcp_urls.items()
                    }
                }
                tools, dispatch, servers = await asyncio.wait_for(
                    program.connect_mcp(config, stack, set()), timeout=MCP_CONNECT_TIMEOUT_S
                )
            compactor = program.Compactor(client, model, tools, False, None)
            compactor.note_good(messages)
            await program.run_chat_loop(
                args,
                compactor,
                messages,
                dispatch,
                servers,
                http if tool_interception_url else None,
            )


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


__all__ = ["WorkbenchChatHarness"]
