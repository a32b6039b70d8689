"""A `DurableServer` built in code reads no setting from the environment unless it is asked to.

`MCP_DURABLE_TOKENS` set in a library user's shell must not silently turn on bearer auth in that
user's test process, nor `MCP_DURABLE_JOURNAL` move its journal: with `trust_env` unset (and no
command line having turned the process default on) the server uses what its code passes, and the
defaults where nothing is passed. `trust_env=True`, or the process default turned on as the
command line does (`config.use_environment`), reads them all. `mcp-durable serve` is in
tests/cli/test_serve_environment.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client

from mcp_durable import DurableServer, ToolPolicy, current_call
from mcp_durable import config as settings
from mcp_durable.journal import DEFAULT_JOURNAL_URL
from tests.helpers import client_as, key_meta, serve_app

TOKENS = "tok-alice=alice,tok-ops=ops"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}},
}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """Every MCP_DURABLE_… setting a server reads, set; returns the journal URL it names. The
    working directory is a fresh one, so a default journal is never the repository's."""
    journal = f"sqlite:///{tmp_path}/from-environment.db"
    monkeypatch.setenv(settings.JOURNAL, journal)
    monkeypatch.setenv(settings.TOKENS, TOKENS)
    monkeypatch.setenv(settings.ADMINS, "ops")
    monkeypatch.setenv(settings.INSTANCE, "replica-7")
    monkeypatch.chdir(tmp_path)
    return journal


def build(**kwargs: Any) -> DurableServer:
    server = DurableServer("payments", **kwargs)

    @server.tool(durable=ToolPolicy(key="required"))
    def whoami(text: str) -> dict[str, Any]:
        return {"principal": current_call().identity.principal, "text": text}

    return server


@asynccontextmanager
async def served(server: DurableServer) -> AsyncIterator[str]:
    """`server` over streamable HTTP in this process; yields its MCP endpoint's URL."""
    async with serve_app(server.streamable_http_app(streamable_http_path="/mcp")) as base:
        yield f"{base}/mcp"


async def _status_without_a_token(url: str) -> int:
    async with httpx2.AsyncClient(timeout=30.0) as http:
        return (await http.post(url, json=INITIALIZE, headers=HEADERS)).status_code


async def test_a_server_built_in_code_ignores_the_settings_in_the_environment(environment: str) -> None:
    by_default = build()
    assert by_default.journal.url == DEFAULT_JOURNAL_URL  # not $MCP_DURABLE_JOURNAL
    assert by_default.admin_principals == frozenset()
    assert by_default.engine.process_id == "server/payments"  # no replica name from $MCP_DURABLE_INSTANCE
    server = build(journal="memory://")
    assert server.journal.url == "memory://"  # the one passed
    async with served(server) as url:
        assert await _status_without_a_token(url) == 200  # no bearer auth: $MCP_DURABLE_TOKENS is not read
        async with Client(url, mode="auto") as client:
            tools = {tool.name for tool in (await client.list_tools()).tools}
            answer = await client.call_tool("whoami", {"text": "x"}, meta=key_meta("k-1"))
    assert tools == {"whoami"}  # no admin tools: $MCP_DURABLE_ADMINS is not read
    assert not answer.is_error and answer.structured_content == {"principal": "local", "text": "x"}


async def test_trust_env_true_reads_the_journal_tokens_admins_and_replica_name(environment: str) -> None:
    server = build(trust_env=True)
    assert server.journal.url == environment
    assert server.admin_principals == frozenset({"ops"})
    assert server.engine.process_id == "server/payments/replica-7"
    async with served(server) as url:
        assert await _status_without_a_token(url) == 401
        async with client_as(url, "tok-alice", "auto") as alice:
            answer = await alice.call_tool("whoami", {"text": "x"}, meta=key_meta("k-1"))
        async with client_as(url, "tok-ops", "auto") as ops:
            tools = {tool.name for tool in (await ops.list_tools()).tools}
    assert answer.structured_content == {"principal": "alice", "text": "x"}
    assert "journal_resolve" in tools


async def test_the_process_default_turned_on_as_the_command_line_does_is_followed_unless_overridden(
    environment: str,
) -> None:
    with settings.environment_used():
        followed = build()
        overridden = build(trust_env=False)
    after = build()
    assert followed.journal.url == environment and followed.admin_principals == {"ops"}
    assert overridden.journal.url == DEFAULT_JOURNAL_URL and overridden.admin_principals == frozenset()
    assert after.journal.url == DEFAULT_JOURNAL_URL  # the default was restored
    async with served(followed) as url:
        assert await _status_without_a_token(url) == 401
    async with served(overridden) as url:
        assert await _status_without_a_token(url) == 200


async def test_arguments_passed_in_code_win_over_a_trusted_environment(environment: str) -> None:
    server = build(trust_env=True, journal="memory://", tokens={"tok-bob": "bob"}, admin_principals=("bob",))
    assert server.journal.url == "memory://" and server.admin_principals == {"bob"}
    async with served(server) as url:
        async with client_as(url, "tok-bob", "auto") as bob:
            answer = await bob.call_tool("whoami", {"text": "x"}, meta=key_meta("k-1"))
        async with httpx2.AsyncClient(timeout=30.0) as http:
            alice = await http.post(url, json=INITIALIZE, headers={**HEADERS, "Authorization": "Bearer tok-alice"})
    assert answer.structured_content == {"principal": "bob", "text": "x"}
    assert alice.status_code == 401  # the environment's token map was not read
