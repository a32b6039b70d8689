"""`journal_lookup(tool, key)`: an agent reads its own record's state and result, and only its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from mcp_durable import DurableServer, ToolPolicy
from tests.helpers import client_as, serve_http
from tests.server.servers.lookup import make_server

TARGET = "tests/server/servers/lookup.py:make_server"


def looked_up(result: Any) -> dict[str, Any]:
    assert not result.is_error, result
    assert result.structured_content is not None
    return dict(result.structured_content)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_each_principal_over_http_looks_up_only_its_own_record_of_a_shared_key(mode: str, tmp_path: Path) -> None:
    env = {"MCP_DURABLE_TOKENS": "tokA=alice,tokB=bob"}
    refund = {"order_id": "O-1", "amount_cents": 500, "card": "4111-1111"}
    async with serve_http(TARGET, journal=f"sqlite:///{tmp_path}/journal.db", env=env) as served:
        async with client_as(served.url, "tokA", mode) as alice:
            assert "journal_lookup" in [t.name for t in (await alice.list_tools()).tools]
            before = looked_up(await alice.call_tool("journal_lookup", {"tool": "refund", "key": "O-1"}))
            paid = await alice.call_tool("refund", refund)
            mine = looked_up(await alice.call_tool("journal_lookup", {"tool": "refund", "key": "O-1"}))
        async with client_as(served.url, "tokB", mode) as bob:
            theirs = looked_up(await bob.call_tool("journal_lookup", {"tool": "refund", "key": "O-1"}))
            await bob.call_tool("refund", refund)
            bobs = looked_up(await bob.call_tool("journal_lookup", {"tool": "refund", "key": "O-1"}))
    assert before == {"found": False, "tool": "refund", "key": "O-1"}
    assert theirs == before  # alice's record answers bob exactly like a key never used
    assert mine["found"] is True and mine["state"] == "completed" and mine["attempts"] == 1
    assert paid.structured_content is not None
    result = mine["result"]["structuredContent"]
    assert result["run"] == paid.structured_content["run"] and result["principal"] == "alice"
    assert result["card"] != "4111-1111" and "4111-1111" not in str(mine)  # sensitive values are masked
    assert bobs["result"]["structuredContent"]["principal"] == "bob"
    assert bobs["result"]["structuredContent"]["run"] != result["run"]
    assert not {"owner", "fingerprint", "run_id", "principal", "lease_until"} & mine.keys()


async def test_the_lookup_tool_is_opt_in() -> None:
    plain = DurableServer("plain", journal="memory://")

    def refund(order_id: str) -> str:
        return order_id

    plain.add_tool(refund, durable=ToolPolicy(key_fields=("order_id",)))
    async with Client(plain) as client:
        assert "journal_lookup" not in [t.name for t in (await client.list_tools()).tools]
    async with Client(make_server("memory://")) as client:
        assert "journal_lookup" in [t.name for t in (await client.list_tools()).tools]
