"""Records are scoped by principal: two HTTP identities with the same key never see each other's
results; requests without a valid bearer token are refused before any tool runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest

from mcp_durable import KEY_META
from tests.helpers import ServedHttp, body_bytes, key_meta, serve_http
from tests.helpers import client_as as _client_as
from tests.server.servers.counting import Counter

COUNTING = "tests/server/servers/counting.py:make_server"
TOKENS = "tokA=alice,tokB=bob"


@asynccontextmanager
async def _authenticated_server(tmp_path: Path) -> AsyncIterator[ServedHttp]:
    env = {"COUNTER_FILE": str(tmp_path / "counter"), "MCP_DURABLE_TOKENS": TOKENS}
    async with serve_http(COUNTING, journal=f"sqlite:///{tmp_path}/journal.db", env=env) as served:
        yield served


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_two_principals_using_the_same_key_each_run_the_tool_and_get_only_their_own_result(
    mode: str, tmp_path: Path
) -> None:
    counter = Counter(tmp_path / "counter")
    call: dict[str, Any] = {"name": "whoami", "arguments": {"text": "same"}, "meta": {KEY_META: "shared-key"}}
    async with _authenticated_server(tmp_path) as served:
        async with _client_as(served.url, "tokA", mode) as alice:
            alice_first = await alice.call_tool(**call)
        async with _client_as(served.url, "tokB", mode) as bob:
            bob_first = await bob.call_tool(**call)
            bob_again = await bob.call_tool(**call)
        async with _client_as(served.url, "tokA", mode) as alice:
            alice_again = await alice.call_tool(**call)
    assert counter.count("whoami") == 2  # once per principal
    assert alice_first.structured_content is not None and bob_first.structured_content is not None
    assert alice_first.structured_content["principal"] == "alice"
    assert bob_first.structured_content["principal"] == "bob"
    assert alice_first.structured_content["run"] != bob_first.structured_content["run"]
    assert bob_first.meta is not None and "mcp-durable/replayed" not in bob_first.meta
    # Each principal's repeat replays its own result, never the other's.
    assert body_bytes(alice_again) == body_bytes(alice_first)
    assert body_bytes(bob_again) == body_bytes(bob_first)
    assert alice_again.meta is not None and alice_again.meta["mcp-durable/replayed"] is True
    assert bob_again.meta is not None and bob_again.meta["mcp-durable/replayed"] is True


async def test_a_request_without_a_valid_bearer_token_is_refused_with_401(tmp_path: Path) -> None:
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "probe", "version": "0"},
        },
    }
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    bad = {
        "no token": {},
        "unknown": {"Authorization": "Bearer tokC"},
        "near miss": {"Authorization": "Bearer tokA-"},
        "not bearer": {"Authorization": "Basic dG9rQTo="},
    }
    async with _authenticated_server(tmp_path) as served:
        async with httpx2.AsyncClient(timeout=30.0) as http:
            refused = {
                name: await http.post(served.url, json=initialize, headers={**headers, **extra})
                for name, extra in bad.items()
            }
            accepted = await http.post(served.url, json=initialize, headers={**headers, "Authorization": "Bearer tokB"})
    assert {name: response.status_code for name, response in refused.items()} == dict.fromkeys(bad, 401)
    # The challenge names this server's own metadata URL (not a default port).
    challenge = refused["no token"].headers["www-authenticate"]
    assert challenge.startswith("Bearer ") and f"127.0.0.1:{served.port}/" in challenge
    assert accepted.status_code == 200  # the same request with a valid token is served


async def test_an_mcp_client_with_a_wrong_token_cannot_call_a_tool(tmp_path: Path) -> None:
    counter = Counter(tmp_path / "counter")
    async with _authenticated_server(tmp_path) as served:
        with pytest.raises(Exception):  # noqa: B017 - the SDK surfaces the 401 as a connection error
            async with _client_as(served.url, "wrong", "legacy") as client:
                await client.call_tool("whoami", {"text": "x"}, meta=key_meta("k"))
    assert counter.count("whoami") == 0
