"""Shared pieces of the hardening tests: a server with hostile-input tools, journal snapshots, raw calls.

`snapshot(journal)` is everything a journal holds (call records and process entries); a refusal
is proven to change nothing by comparing snapshots taken before and after it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.server.mcpserver.exceptions import ToolError

from mcp_durable import ToolPolicy
from mcp_durable.journal import CallQuery, Journal
from mcp_durable.journal.base import each_call
from mcp_durable.journal.model import CallRecord, JournalEntry
from mcp_durable.server import DurableServer
from tests.conftest import _backend_available, make_journal_factory

KEY_META = "mcp-durable/idempotency-key"
EMBEDDED = ["memory", "sqlite", "file"]
MODES = ["legacy", "auto"]


async def snapshot(journal: Journal) -> tuple[list[CallRecord], list[JournalEntry]]:
    """Every call record and every process entry the journal holds (compare two to prove no change)."""
    records = [record async for record in each_call(journal, CallQuery(limit=500))]
    return records, await journal.entries()


class Runs:
    """How often each tool body actually ran (the side effect the journal must guard)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def count(self, tool: str) -> int:
        return sum(1 for name, _ in self.calls if name == tool)


def build_server(journal: Journal | str, runs: Runs, **kwargs: Any) -> DurableServer:
    """A DurableServer with tools that take and return hostile things."""
    server = DurableServer("hardening", journal=journal, **kwargs)

    @server.tool(durable=True)
    def echo(text: str) -> dict[str, Any]:
        runs.calls.append(("echo", text))
        return {"text": text}

    @server.tool(durable=ToolPolicy(key="required"))
    def pay(order_id: str, amount_cents: int) -> dict[str, Any]:
        runs.calls.append(("pay", order_id))
        return {"order_id": order_id, "amount_cents": amount_cents}

    @server.tool(durable=True)
    def count(n: int) -> dict[str, Any]:
        runs.calls.append(("count", n))
        return {"n": n}

    @server.tool(durable=True)
    def blob(size: int) -> str:
        runs.calls.append(("blob", size))
        return "x" * size

    @server.tool(durable=True)
    def huge_number() -> dict[str, Any]:
        runs.calls.append(("huge_number", None))
        return {"n": 2**70}  # valid Python, not representable by the journal's JSON (64-bit integers)

    @server.tool(durable=ToolPolicy(exceptions="persist"))
    def huge_number_persisted() -> dict[str, Any]:
        runs.calls.append(("huge_number_persisted", None))
        return {"n": 2**70}

    @server.tool(durable=True)
    def refuse(reason: str) -> str:
        runs.calls.append(("refuse", reason))
        raise ToolError(reason)

    return server


@pytest.fixture(params=EMBEDDED)
def embedded(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    if not _backend_available(kind):
        pytest.skip(f"the {kind} journal is not built yet")
    return kind


@pytest.fixture
def journal_for(tmp_path: Path) -> Callable[[str], Journal]:
    """A fresh, unopened journal of a backend kind under this test's tmp_path."""
    return lambda kind: make_journal_factory(kind, tmp_path)()


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def connect(server: DurableServer, mode: str) -> Client:
    return Client(server, mode=mode)


def text_of(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def owner_only(path: str | os.PathLike[str]) -> bool:
    """True when group and others have no permission bits on `path`."""
    return (os.stat(path).st_mode & 0o077) == 0
