"""The TypeScript SDK 1.32 experimental tasks client (2025-11-25) against `mcp-durable proxy` over HTTP,
in front of the plain Python upstream: the proxy's own tasks of a proxied tool, as a client written
on another SDK meets them (`callToolStream`, `getTask`, `getTaskResult`, `listTasks`); and (target
`fastmcp`) against the same tools on a durable FastMCP server (tests/fastmcp/clients_app.py), whose
tasks `DurableTasks` serves: one task per key, a resent task-creating call gets the same task."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from tests.helpers import serve_app, serve_cli_http
from tests.node_peers import NODE_MODULES, node_script, require_node_peers
from tests.proxy.task_clients import TARGETS, ServedUrl
from tests.proxy.upstreams import plain_http_upstream, proxy_cli, upstream_env
from tests.server.servers.counting import Counter

CLIENT = r"""
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

// ES modules resolve bare names from the script's own folder (a temp dir): import by path instead.
const sdk = (path) =>
  import(pathToFileURL(join(process.env.NODE_MODULES, '@modelcontextprotocol/sdk/dist/esm', path)).href);
const { Client } = await sdk('client/index.js');
const { StreamableHTTPClientTransport } = await sdk('client/streamableHttp.js');
const { CallToolResultSchema } = await sdk('types.js');

const [url, gate] = process.argv.slice(2);
const out = {};
const client = new Client({ name: 'ts-proxy-tasks', version: '1.0.0' });
await client.connect(new StreamableHTTPClientTransport(new URL(url)));
out.capabilities = client.getServerCapabilities().tasks ?? null;
const tools = await client.listTools();
out.support = Object.fromEntries(tools.tools.map((t) => [t.name, t.execution?.taskSupport ?? null]));
const tasks = client.experimental.tasks;
const KEY = 'mcp-durable/idempotency-key';

async function created(params) {
  for await (const message of tasks.callToolStream(params, CallToolResultSchema)) {
    if (message.type === 'taskCreated') return message.task;
    if (message.type === 'error') throw message.error;
  }
  throw new Error('no taskCreated');
}

const charge = { name: 'charge', arguments: { order_id: 'T-1', amount_cents: 100 }, _meta: { [KEY]: 'k-T-1' } };
const first = await created(charge);
out.first = first;
out.repeatId = (await created(charge)).taskId;
out.polled = await tasks.getTask(first.taskId);
writeFileSync(gate, '');
out.result = await tasks.getTaskResult(first.taskId, CallToolResultSchema);
out.done = await tasks.getTask(first.taskId);
out.finishedRepeatId = (await created(charge)).taskId;
out.listed = (await tasks.listTasks()).tasks.map((t) => t.taskId);

// The whole stream of another key: created, statuses, result.
const kinds = [];
const other = { ...charge, arguments: { order_id: 'T-2', amount_cents: 200 }, _meta: { [KEY]: 'k-T-2' } };
for await (const message of tasks.callToolStream(other, CallToolResultSchema)) {
  kinds.push(message.type);
  if (message.type === 'result') out.streamed = message.result;
  if (message.type === 'error') out.streamError = String(message.error);
}
out.kinds = kinds;
console.log(JSON.stringify(out));
await client.close();
"""


@asynccontextmanager
async def _served(target: str, tmp_path: Path, env: dict[str, str]) -> AsyncIterator[ServedUrl]:
    """`charge` served with tasks by `target`: the proxy in front of the plain upstream, or a
    durable FastMCP server with the same tools (`clients_app`)."""
    journal = f"file://{tmp_path}/journal"
    if target == "fastmcp":
        from tests.fastmcp.clients_app import clients_app

        async with serve_app(clients_app(journal, env, task_after=0).http_app()) as base:
            yield ServedUrl(f"{base}/mcp", lambda: "")
        return
    policies = tmp_path / "policies.toml"
    policies.write_text('[tools.charge]\nkey = "required"\ntask_support = "optional"\n')
    async with plain_http_upstream(env) as upstream:
        args = proxy_cli(["--upstream-url", upstream.url], journal, "--policies", str(policies))
        async with serve_cli_http(args, env=env) as proxy:
            yield ServedUrl(proxy.url, proxy.stderr)


@pytest.mark.parametrize("target", TARGETS)
async def test_the_typescript_sdk_tasks_client_gets_one_task_per_key(target: str, tmp_path: Path) -> None:
    require_node_peers()
    env = upstream_env(tmp_path)
    counter = Counter(env["COUNTER_FILE"])
    async with _served(target, tmp_path, env) as served:
        run = await anyio.to_thread.run_sync(
            lambda: node_script(
                tmp_path / "client.mjs",
                CLIENT,
                args=[served.url, str(counter.gate)],
                timeout=60,
                env={"NODE_MODULES": str(NODE_MODULES)},
            )
        )
        assert run.returncode == 0, run.stderr + served.stderr()
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["capabilities"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    assert out["support"]["charge"] == "optional" and out["support"]["record"] is None
    first = out["first"]
    assert first["status"] == "working"
    assert out["repeatId"] == first["taskId"] and out["finishedRepeatId"] == first["taskId"]
    assert out["polled"]["taskId"] == first["taskId"]
    assert out["result"]["isError"] is False
    assert out["result"]["structuredContent"] == {"order_id": "T-1", "amount_cents": 100, "key": "k-T-1"}
    assert out["result"]["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": first["taskId"]}
    assert out["done"]["status"] == "completed" and first["taskId"] in out["listed"]
    assert out["kinds"][0] == "taskCreated" and out["kinds"][-1] == "result", out
    assert out["streamed"]["structuredContent"]["key"] == "k-T-2"
    assert counter.count("charge") == 2 and counter.count("charge.deduplicated") == 0  # once per key upstream
