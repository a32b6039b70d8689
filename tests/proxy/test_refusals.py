"""The proxy's refusals are valid answers for clients that validate structured content.

An upstream tool returning `str` declares an output schema requiring `{"result": …}`. A refusal
of a durable call of it through the proxy (here `key_reuse`) must not carry the refusal as
`structuredContent` (the TypeScript SDK's `callTool` would throw): it is in
`_meta["mcp-durable/error"]`, judged against the *upstream's* schema, as `serve` does for its own.
"""

from __future__ import annotations

import json
from pathlib import Path

from mcp import Client

from tests.helpers import serve_cli_http
from tests.node_peers import node_script
from tests.proxy.upstreams import plain_http_upstream, proxy_cli, upstream_env
from tests.server.servers.counting import Counter

TS_CLIENT = r"""
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url] = process.argv.slice(2);
const client = new Client({ name: "proxy-refusal-test", version: "1.0.0" });
await client.connect(new StreamableHTTPClientTransport(new URL(url)));
await client.listTools(); // the SDK validates results against the listed output schemas
const meta = { "mcp-durable/idempotency-key": "shout-1" };
const first = await client.callTool({ name: "shout", arguments: { text: "hi" }, _meta: meta });
const reused = await client.callTool({ name: "shout", arguments: { text: "other" }, _meta: meta });
console.log(JSON.stringify({ first, reused }));
await client.close();
"""


async def test_a_refusal_of_an_upstream_tool_fits_the_upstreams_output_schema(tmp_path: Path) -> None:
    env = upstream_env(tmp_path)
    async with plain_http_upstream(env) as upstream:
        args = proxy_cli(["--upstream-url", upstream.url], f"file://{tmp_path}/journal")
        async with serve_cli_http(args, env=env) as proxy:
            async with Client(proxy.url, mode="legacy") as client:
                tools = {tool.name: tool for tool in (await client.list_tools()).tools}
                assert tools["shout"].output_schema is not None
                assert "result" in tools["shout"].output_schema.get("required", [])
            run = node_script(tmp_path / "client.mjs", TS_CLIENT, args=[proxy.url])
    assert run.returncode == 0, run.stderr  # before the fix: "Structured content does not match…"
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["first"]["structuredContent"] == {"result": "HI"}
    reused = seen["reused"]
    assert reused["isError"] is True
    assert reused["_meta"]["mcp-durable/error"]["error"] == "key_reuse"
    assert "structuredContent" not in reused  # it would not match {"result": string}
    assert reused["content"][0]["text"].startswith("key_reuse: ")
    assert Counter(env["COUNTER_FILE"]).count("shout") == 1  # the refused call never ran upstream
