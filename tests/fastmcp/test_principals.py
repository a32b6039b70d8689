"""Records are scoped by the bearer token's principal on a FastMCP server with auth: two principals
using the same key each make their own effect and each repeat replays only its own answer.

A real streamable HTTP server (uvicorn on a free port) with FastMCP's `StaticTokenVerifier`,
called by the MCP SDK's client in both eras and by FastMCP's own client.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fastmcp.servers import CLIENTS, TOKENS, FastMCP, Shop, connected, make_durable, shop_app
from tests.helpers import body_bytes, meta_of, serve_app

REFUND = {"order_id": "O-7", "amount_cents": 700}


@pytest.mark.parametrize("client", CLIENTS)
async def test_two_bearer_principals_with_one_key_each_get_their_own_effect_and_replay(
    client: str, tmp_path: Path
) -> None:
    shop = Shop(tmp_path)
    app = shop_app(shop, tokens=TOKENS)
    make_durable(app, journal=f"sqlite:///{tmp_path}/journal.db", policies=shop.policies)
    async with connected(client, app, token="tokA") as alice:
        alice_first = await alice.call("refund", REFUND, key="shared")
    async with connected(client, app, token="tokB") as bob:
        bob_first = await bob.call("refund", REFUND, key="shared")
        bob_again = await bob.call("refund", REFUND, key="shared")
    async with connected(client, app, token="tokA") as alice:
        alice_again = await alice.call("refund", REFUND, key="shared")
    effects = shop.ledger.effects(op="refund")
    assert len(effects) == 2  # once per principal
    # The provider got each principal's scoped key: two principals' keys never meet downstream.
    assert sorted(request["idempotency_key"] for request in shop.ledger.requests()) == ["alice:shared", "bob:shared"]
    assert alice_first.structured_content is not None and bob_first.structured_content is not None
    assert alice_first.structured_content["id"] != bob_first.structured_content["id"]
    assert body_bytes(alice_again) == body_bytes(alice_first)
    assert body_bytes(bob_again) == body_bytes(bob_first)
    assert meta_of(alice_again)["mcp-durable/replayed"] is True and meta_of(bob_again)["mcp-durable/replayed"] is True
    assert "mcp-durable/replayed" not in meta_of(bob_first)


async def test_a_request_without_a_valid_token_is_refused_before_any_tool_runs(tmp_path: Path) -> None:
    import httpx2

    shop = Shop(tmp_path)
    app: FastMCP = shop_app(shop, tokens=TOKENS)
    make_durable(app, journal="memory://", policies=shop.policies)
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "refund", "arguments": REFUND}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with serve_app(app.http_app()) as base:
        async with httpx2.AsyncClient(timeout=30.0) as http:
            refused = await http.post(f"{base}/mcp", json=call, headers={**headers, "Authorization": "Bearer tokC"})
    assert refused.status_code == 401
    assert shop.ledger.requests() == []
