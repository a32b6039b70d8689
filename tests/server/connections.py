"""In-memory connections that close in any order, for tests of what a server shares between them.

    async with two_connections(server, "legacy") as (first, last):
        await first.close()                      # the first leaves; `last.client` is still served
        await last.client.call_tool(...)

Each `Client(server)` is held open in a task of its own (anyio ties a client's task group to the
task that entered it), so the first one opened can close while the last stays open, as two
stdio or in-memory connections of a real server do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from mcp import Client

#: How long opening or closing a connection may take before the test fails (a bound on a hang).
BOUND = 10.0


class Connection:
    """An in-memory client of `server` in `mode`, held open in a task of its own until `close()`."""

    def __init__(self, server: Any, mode: str) -> None:
        self.server = server
        self.mode = mode
        self._client: Client | None = None
        self._opened = anyio.Event()
        self._leave = anyio.Event()
        self._closed = anyio.Event()

    @property
    def client(self) -> Client:
        assert self._client is not None and not self._closed.is_set(), "the connection is not open"
        return self._client

    async def hold(self) -> None:
        """Open the client and keep it open until `close()` (run it in a task of its own)."""
        try:
            async with Client(self.server, mode=self.mode) as client:
                self._client = client
                self._opened.set()
                await self._leave.wait()
        finally:
            self._closed.set()

    async def opened(self) -> None:
        with anyio.fail_after(BOUND):
            await self._opened.wait()

    async def close(self) -> None:
        """Close the client; fails the test if that does not end within `BOUND` seconds."""
        self._leave.set()
        with anyio.fail_after(BOUND):
            await self._closed.wait()


@asynccontextmanager
async def two_connections(server: Any, mode: str) -> AsyncIterator[tuple[Connection, Connection]]:
    """Two open connections to `server`, opened in order; both are closed on exit (if still open)."""
    first, last = Connection(server, mode), Connection(server, mode)
    async with anyio.create_task_group() as tg:
        for connection in (first, last):
            tg.start_soon(connection.hold)
            await connection.opened()
        try:
            yield first, last
        finally:
            await first.close()
            await last.close()
