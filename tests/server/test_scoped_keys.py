"""Over HTTP with two bearer-token principals whose names and keys contain `:`, each principal's
downstream key is its own: the provider that deduplicates by `current_call().scoped_key` runs
both refunds, and each principal gets its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from mcp_durable import DurableServer, current_call
from tests.helpers import client_as, key_meta, serve_app


class Provider:
    """A payment provider that deduplicates refunds by the idempotency key it is given."""

    def __init__(self) -> None:
        self.refunds: dict[str, str] = {}

    def refund(self, order_id: str, idempotency_key: str) -> dict[str, Any]:
        first = self.refunds.setdefault(idempotency_key, order_id)
        return {"refunded": first, "downstream_key": idempotency_key}


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_principals_and_keys_with_colons_never_share_a_downstream_key(tmp_path: Path, mode: str) -> None:
    provider = Provider()
    server = DurableServer("scoped", journal=f"sqlite:///{tmp_path}/journal.db", tokens={"tok-a": "a", "tok-ab": "a:b"})

    @server.tool(durable=True)
    def refund(order_id: str) -> dict[str, Any]:
        return provider.refund(order_id, current_call().scoped_key)

    async with serve_app(server.streamable_http_app(streamable_http_path="/mcp")) as base:
        url = f"{base}/mcp"
        async with client_as(url, "tok-a", mode) as a:
            first = await a.call_tool("refund", {"order_id": "O-A"}, meta=key_meta("b:K1"))
        async with client_as(url, "tok-ab", mode) as ab:
            second = await ab.call_tool("refund", {"order_id": "O-AB"}, meta=key_meta("K1"))
        # The `local` principal (in-memory) with the key spelling principal `a:b`'s scoped key.
        async with Client(server, mode=mode) as local:
            third = await local.call_tool("refund", {"order_id": "O-LOCAL"}, meta=key_meta("a:b:K1"))
    assert first.structured_content is not None and second.structured_content is not None
    # Before the fix both were `a:b:K1`: the second principal got the first one's refund back.
    assert second.structured_content["refunded"] == "O-AB"
    assert first.structured_content["refunded"] == "O-A"
    assert third.structured_content is not None and third.structured_content["refunded"] == "O-LOCAL"
    assert sorted(provider.refunds.values()) == ["O-A", "O-AB", "O-LOCAL"]
    assert first.structured_content["downstream_key"] != second.structured_content["downstream_key"]
