"""The TypeScript SDK's client (tests/node, `@modelcontextprotocol/sdk` 1.32) against a FastMCP 4
server made durable, served over streamable HTTP by a process of its own (`shop_server.py`).

One key called twice runs the refund once (the provider's ledger, read here, counts the requests
it got) and the second answer is the replay: the same content, structured content and `isError`,
marked `mcp-durable/replayed` with the first answer's `mcp-durable/first-completed-at`. The key
used again with other arguments is refused `key_reuse`, as a result the SDK accepts (it validates
structured content against the tool's listed output schema, and would throw). The mail, whose
outbox does not deduplicate, is sent once per key, and refused `missing_key` without one.

Protocol eras: this SDK offers only the 2025-11-25 handshake (it has no way to select
2026-07-28: its `SUPPORTED_PROTOCOL_VERSIONS` end there), so that is the era tested here; the
2026-07-28 era is tested through the MCP Python SDK's client (test_calls.py, `mcp-auto`). The test
checks that list, so it fails, asking for the era to be added, when tests/node's SDK learns it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio.to_thread

from mcp_durable import KEY_META
from tests.fastmcp.servers import Shop, serve_shop_http, shop_env
from tests.node_peers import node_script, require_node_peers

REPLAYED = "mcp-durable/replayed"
FIRST = "mcp-durable/first-completed-at"
ERA_2025 = "2025-11-25"

TS_CLIENT = r"""
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { SUPPORTED_PROTOCOL_VERSIONS } from "@modelcontextprotocol/sdk/types.js";

const [url, KEY] = process.argv.slice(2);
const client = new Client({ name: "fastmcp-durable-test", version: "1.0.0" });
const transport = new StreamableHTTPClientTransport(new URL(url));
await client.connect(transport);
const out = { protocolVersion: transport.protocolVersion, supported: SUPPORTED_PROTOCOL_VERSIONS };
// As real clients do: the SDK then validates each result's structured content against these schemas.
out.tools = Object.fromEntries((await client.listTools()).tools.map((t) => [t.name, t.annotations ?? {}]));

async function call(name, args, key) {
  const params = { name, arguments: args };
  if (key !== undefined) params._meta = { [KEY]: key };
  try {
    return await client.callTool(params);
  } catch (e) {
    return { threw: String(e) };
  }
}

const refund = { order_id: "O-1", amount_cents: 500 };
out.first = await call("refund", refund, "refund-O-1");
out.again = await call("refund", refund, "refund-O-1");
out.reused = await call("refund", { ...refund, amount_cents: 900 }, "refund-O-1");
out.other = await call("refund", refund, "refund-O-1-again");
const mail = { to: "ada@example.com", subject: "Your refund", body: "500 cents are on their way." };
out.mail = await call("send_mail", mail, "mail-O-1");
out.mailAgain = await call("send_mail", mail, "mail-O-1");
out.unkeyed = await call("send_mail", mail);
console.log(JSON.stringify(out));
await client.close();
"""


def body(result: dict[str, Any]) -> tuple[Any, Any, Any]:
    """What a replay keeps identical: content, structured content, isError."""
    return result["content"], result.get("structuredContent"), result.get("isError", False)


def refusal(result: dict[str, Any]) -> dict[str, Any]:
    assert "threw" not in result, f"the TypeScript SDK rejected the answer: {result}"
    assert result.get("isError") is True, result
    error: dict[str, Any] = result["_meta"]["mcp-durable/error"]
    assert result["content"][0]["text"].startswith(f"{error['error']}: ")
    return error


def replayed_pair(first: dict[str, Any], again: dict[str, Any], key: str) -> None:
    """`again` is the replay of `first` under `key`, marked as the contract says."""
    for result in (first, again):
        assert "threw" not in result, f"the TypeScript SDK rejected the answer: {result}"
        assert result.get("isError", False) is False, result
        assert result["_meta"]["mcp-durable/key"] == key
    assert REPLAYED not in first["_meta"]
    assert again["_meta"][REPLAYED] is True
    assert again["_meta"][FIRST] == first["_meta"][FIRST]
    assert body(again) == body(first)


async def test_the_typescript_sdk_client_gets_one_refund_per_key_its_replay_and_key_reuse(tmp_path: Path) -> None:
    require_node_peers()
    shop = Shop(tmp_path)
    async with serve_shop_http(f"file://{tmp_path}/journal", shop_env(shop)) as url:
        # node blocks while it runs: in a thread, so this event loop stays free.
        run = await anyio.to_thread.run_sync(
            lambda: node_script(tmp_path / "client.mjs", TS_CLIENT, args=[url, KEY_META])
        )
    assert run.returncode == 0, run.stdout + run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])

    assert seen["protocolVersion"] == ERA_2025
    assert seen["supported"][0] == ERA_2025, (
        f"tests/node's TypeScript SDK now speaks {seen['supported'][0]}: select that era here too"
    )
    assert seen["tools"]["refund"]["idempotentHint"] is True

    replayed_pair(seen["first"], seen["again"], "refund-O-1")
    assert seen["first"]["structuredContent"]["amount_cents"] == 500
    other = seen["other"]  # a new key: a new refund
    assert other["structuredContent"]["id"] != seen["first"]["structuredContent"]["id"]
    reused = refusal(seen["reused"])
    assert reused["error"] == "key_reuse" and reused["key"] == "refund-O-1"
    assert seen["reused"]["_meta"]["mcp-durable/key"] == "refund-O-1"
    assert seen["reused"]["structuredContent"] == reused  # the tool's open object schema accepts it

    replayed_pair(seen["mail"], seen["mailAgain"], "mail-O-1")
    assert refusal(seen["unkeyed"])["error"] == "missing_key"

    # Counted downstream, outside the server: one request per key reached the provider.
    assert [effect["amount_cents"] for effect in shop.ledger.effects(op="refund")] == [500, 500]
    assert len(shop.ledger.requests()) == 2
    assert [mail["key"] for mail in shop.outbox.mails()] == ["mail-O-1"]
