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
    """One HTTP client for every episode's calls to the interception server: the server is
    local, and a client per episode would rebuild its TLS context each time."""
    import httpx

    return httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0))


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
            await self._chat(ctx.model, endpoint, secret, mcp_urls, messages, tool_interception_url)
        except SystemExit as exit:  # the loop's way to say its model connection failed
            code = exit.code if isinstance(exit.code, int) else 1
            return ProgramResult(exit_code=code, stdout="", stderr=traceback.format_exc())
        except Exception:  # the program would have died with this traceback
            return ProgramResult(exit_code=1, stdout="", stderr=traceback.format_exc())
        return ProgramResult(exit_code=0, stdout="", stderr="")

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


__all__ = ["WorkbenchChatHarness"]
