"""Over streamable HTTP with bearer identities (`mcp-durable serve` subprocess): a principal reads
only its own records through every resource, an admin reads everyone's, and a non-admin gets no
admin resource and cannot call an admin tool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from tests.helpers import client_as, first_text, key_meta, read_json, serve_http

COUNTING = "tests/server/servers/counting.py:make_server"
ENV = {"MCP_DURABLE_TOKENS": "tokA=alice,tokB=bob,tokO=ops", "MCP_DURABLE_ADMINS": "ops"}


async def refused(client: Any, uri: str) -> str:
    with pytest.raises(MCPError) as caught:
        await client.read_resource(uri)
    return str(caught.value)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_over_http_each_principal_reads_only_its_own_records_and_an_admin_reads_all(
    mode: str, tmp_path: Path
) -> None:
    env = {**ENV, "COUNTER_FILE": str(tmp_path / "counter")}
    async with serve_http(COUNTING, journal=f"sqlite:///{tmp_path}/j.db", env=env) as served:
        async with client_as(served.url, "tokA", mode) as alice:
            await alice.call_tool("record", {"text": "a"}, meta=key_meta("shared"))
        async with client_as(served.url, "tokB", mode) as bob:
            await bob.call_tool("record", {"text": "b"}, meta=key_meta("shared"))
            await bob.call_tool("record", {"text": "b2"}, meta=key_meta("bob-only"))

        async with client_as(served.url, "tokA", mode) as alice:
            mine = await read_json(alice, "journal://calls/record/shared")
            assert mine["principal"] == "alice" and mine["arguments"] == {"text": "a"}
            listing = await read_json(alice, "journal://calls")
            assert [(c["principal"], c["key"]) for c in listing["calls"]] == [("alice", "shared")]
            assert (await read_json(alice, "journal://calls?tool=record&state=completed"))["calls"] == listing["calls"]
            stats = await read_json(alice, "journal://stats")
            assert stats["scope"] == "principal" and stats["calls"] == 1 and "entries" not in stats
            assert (await read_json(alice, "journal://in-doubt"))["count"] == 0
            # Bob's record, his key, the admin-only resources: all answer like URIs nothing serves.
            for uri in (
                "journal://calls/record/bob-only",
                "journal://calls/record/shared?principal=bob",
                "journal://entries",
                "journal://processes/server%2Fcounting",
            ):
                assert f"Unknown resource: {uri}" in await refused(alice, uri)
            assert "journal_resolve" in {t.name for t in (await alice.list_tools()).tools}
            denied = await alice.call_tool(
                "journal_resolve", {"tool": "record", "key": "shared", "resolution": "not_applied"}
            )
            assert denied.is_error and "forbidden" in first_text(denied)
            denied = await alice.call_tool("journal_purge_expired", {})
            assert denied.is_error and "forbidden" in first_text(denied)

        async with client_as(served.url, "tokO", mode) as ops:
            everyone = await read_json(ops, "journal://calls")
            assert sorted((c["principal"], c["key"]) for c in everyone["calls"]) == [
                ("alice", "shared"),
                ("bob", "bob-only"),
                ("bob", "shared"),
            ]
            bobs = await read_json(ops, "journal://calls/record/shared?principal=bob")
            assert bobs["principal"] == "bob" and bobs["arguments"] == {"text": "b"}
            stats = await read_json(ops, "journal://stats")
            assert stats["scope"] == "all" and stats["calls"] == 3 and stats["backend"] == "sqlite"
            entries = await read_json(ops, "journal://entries")
            assert any(e["process_id"] == "server/counting" for e in entries["entries"])
            process = await read_json(ops, "journal://processes/server%2Fcounting")
            assert process["lifecycle_state"] == "running"
            purged = await ops.call_tool("journal_purge_expired", {})
            assert not purged.is_error and purged.structured_content == {"purged": 0}
        # Alice's record is untouched by anything the others did.
        async with client_as(served.url, "tokA", mode) as alice:
            assert (await read_json(alice, "journal://calls/record/shared"))["state"] == "completed"
