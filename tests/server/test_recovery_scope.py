"""`journal://recovery` over HTTP with bearer principals: each principal sees how many of its own
calls the start found in doubt; an admin sees the journal-wide count. Before the fix every
principal saw the journal-wide count (other principals' activity)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from mcp.types import TextResourceContents

from mcp_durable import DurableServer
from mcp_durable.journal import CallIdentity, CallRecord, CallState, create_journal
from mcp_durable.keys import fingerprint
from tests.helpers import client_as, serve_app


async def _orphan(url: str, principal: str, key: str) -> None:
    """A PENDING call of `principal` whose owner died long ago (its lease ran out)."""
    journal = create_journal(url)
    await journal.open()
    try:
        arguments = {"text": key}
        record = CallRecord(
            identity=CallIdentity(principal, "record", key),
            fingerprint=fingerprint(arguments),
            state=CallState.PENDING,
            version=1,
            run_id=key,
            attempts=1,
            created_at=2.0,
            updated_at=2.0,
            owner="dead-replica",
            lease_until=3.0,
            arguments=orjson.dumps(arguments),
        )
        assert (await journal.claim(record, 2.0))[0]
    finally:
        await journal.aclose()


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_recovery_shows_each_principal_its_own_in_doubt_count_and_an_admin_the_total(
    tmp_path: Path, mode: str
) -> None:
    url = f"sqlite:///{tmp_path}/journal.db"
    for principal, key in (("alice", "a-1"), ("alice", "a-2"), ("bob", "b-1")):
        await _orphan(url, principal, key)
    server = DurableServer(
        "recovery",
        journal=url,
        tokens={"tok-a": "alice", "tok-b": "bob", "tok-c": "carol", "tok-o": "ops"},
        admin_principals=("ops",),
    )

    @server.tool(durable=True)
    def record(text: str) -> str:
        return text

    seen: dict[str, Any] = {}
    async with serve_app(server.streamable_http_app(streamable_http_path="/mcp")) as base:
        for token, name in (("tok-a", "alice"), ("tok-b", "bob"), ("tok-c", "carol"), ("tok-o", "ops")):
            async with client_as(f"{base}/mcp", token, mode) as client:
                (content,) = (await client.read_resource("journal://recovery")).contents
                assert isinstance(content, TextResourceContents), content
                seen[name] = orjson.loads(content.text)
    assert {name: body["calls_found_in_doubt"] for name, body in seen.items()} == {
        "alice": 2,
        "bob": 1,
        "carol": 0,
        "ops": 3,
    }
    assert seen["alice"]["scope"] == "principal" and seen["ops"]["scope"] == "all"
