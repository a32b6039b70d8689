"""Driving a crash-test server over stdio: call, notice the SIGKILL, restart, retry with the same key.

`StdioServer` owns one `mcp-durable serve …` subprocess at a time through a real MCP client
(protocol 2025-11-25, whose stdio client reports a dead server as a closed connection at once).
`call()` returns the `CallToolResult`, or None when the server died during the call; `restart()`
starts a fresh process on the same journal (the previous one is gone: a new boot).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import anyio
from mcp import Client, MCPError
from mcp_types import CallToolResult

from tests.helpers import key_meta, stdio_params

CALL_TIMEOUT = 60.0


def journal_url(kind: str, tmp: os.PathLike[str] | str) -> str:
    """The journal URL of a crash configuration: `sqlite` (shared, leases), `sqlite-single-writer`,
    `file`, `postgres` (a fresh schema on the test server)."""
    if kind == "sqlite":
        return f"sqlite:///{tmp}/journal.db"
    if kind == "sqlite-single-writer":
        return f"sqlite:///{tmp}/journal.db?single_writer=1"
    if kind == "file":
        return f"file://{tmp}/journal"
    if kind == "postgres":
        from tests.conftest import scratch_postgres_url

        return scratch_postgres_url()  # skips without a server, fails under CI; dropped after the test
    raise ValueError(kind)


@dataclass
class Boots:
    """How many server processes a run started and how many died by SIGKILL."""

    started: int = 0
    killed: int = 0


class StdioServer:
    """One `mcp-durable serve TARGET --journal URL` over stdio at a time, restartable."""

    def __init__(self, target: str, journal: str, env: Mapping[str, str]) -> None:
        self.params = stdio_params(target, journal=journal, env=env)
        self.boots = Boots()
        self._stack: AsyncExitStack | None = None
        self.client: Client | None = None

    async def start(self) -> None:
        stack = AsyncExitStack()
        # No timeout scope around entering: the client's task group must not live inside a
        # cancel scope that is exited before it.
        self.client = await stack.enter_async_context(Client(self.params, mode="legacy"))
        self._stack = stack
        self.boots.started += 1

    async def stop(self) -> None:
        stack, self._stack, self.client = self._stack, None, None
        if stack is not None:
            try:
                await stack.aclose()
            except Exception:  # noqa: BLE001 - the process may already be dead; that is the point
                pass

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def call(self, tool: str, arguments: dict[str, Any], key: str | None = None) -> CallToolResult | None:
        """The result, or None if the server died during the call (it is then stopped)."""
        assert self.client is not None, "start() first"
        meta = key_meta(key) if key is not None else None
        try:
            with anyio.fail_after(CALL_TIMEOUT):
                return await self.client.call_tool(tool, arguments, meta=meta)
        except (MCPError, anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
            self.boots.killed += 1
            await self.stop()
            return None

    async def __aenter__(self) -> StdioServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def error_code(result: CallToolResult) -> str | None:
    """The mcp-durable refusal code of an error result (`in_doubt`, …), else None."""
    if not result.is_error:
        return None
    structured = result.structured_content or {}
    code = structured.get("error")
    return str(code) if code is not None else "tool_error"
