"""The TypeScript SDK 1.32 experimental tasks client (2025-11-25) against `mcp-durable serve` over HTTP:
`callToolStream`, `getTask`, `getTaskResult`, `listTasks`, `cancelTask`, and a repeated create with
the same key that gets the same task and one execution."""

from __future__ import annotations

import json
from pathlib import Path

from mcp_durable.demo.ledger import PaymentProvider
from tests.helpers import serve_http
from tests.node_peers import NODE_MODULES, node_script, require_node_peers
from tests.server.servers.counting import Counter

TASKS = "tests/server/servers/tasks.py:make_server"

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

const [url, gates] = process.argv.slice(2);
const out = {};
const client = new Client({ name: 'ts-tasks', version: '1.0.0' });
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
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Create, repeat with the same key, poll, fetch the result.
const refund = { name: 'refund', arguments: { order_id: 'T-1', amount_cents: 100 }, _meta: { [KEY]: 'k-T-1' } };
const first = await created(refund);
const repeat = await created(refund);
out.first = first;
out.repeatId = repeat.taskId;
out.polled = await tasks.getTask(first.taskId);
writeFileSync(join(gates, 'T-1'), '');
out.result = await tasks.getTaskResult(first.taskId, CallToolResultSchema);
out.done = await tasks.getTask(first.taskId);
out.listed = (await tasks.listTasks()).tasks.map((t) => t.taskId);

// Cancel a running task.
const doomed = await created({ name: 'refund', arguments: { order_id: 'T-2', amount_cents: 200 } });
await sleep(200);
out.cancelled = await tasks.cancelTask(doomed.taskId);
out.afterCancel = await tasks.getTask(doomed.taskId);
try { await tasks.cancelTask(doomed.taskId); out.cancelAgain = 'accepted'; }
catch (e) { out.cancelAgain = e.code; }

// The whole stream of a task-required tool: created, statuses, result.
const kinds = [];
for await (const message of tasks.callToolStream({ name: 'job', arguments: { name: 'ts' } }, CallToolResultSchema)) {
  kinds.push(message.type);
  if (message.type === 'result') out.jobResult = message.result;
  if (message.type === 'error') out.jobError = String(message.error);
}
out.kinds = kinds;
try { await client.callTool({ name: 'job', arguments: { name: 'plain' } }); out.requiredPlain = 'accepted'; }
catch (e) { out.requiredPlain = e.code; }
console.log(JSON.stringify(out));
await client.close();
"""


async def test_the_typescript_sdk_tasks_client_creates_polls_fetches_and_cancels(tmp_path: Path) -> None:
    require_node_peers()
    gates = tmp_path / "gates"
    gates.mkdir()
    env = {
        "COUNTER_FILE": str(tmp_path / "counter"),
        "TASK_GATE": str(gates),
        "PAYMENTS_LEDGER": str(tmp_path / "ledger.db"),
    }
    async with serve_http(TASKS, journal=f"file://{tmp_path / 'journal'}", env=env) as served:
        run = node_script(
            tmp_path / "client.mjs",
            CLIENT,
            args=[served.url, str(gates)],
            timeout=60,
            env={"NODE_MODULES": str(NODE_MODULES)},
        )
        assert run.returncode == 0, run.stderr + served.stderr()
    out = json.loads(run.stdout.strip().splitlines()[-1])
    counts = Counter(tmp_path / "counter")
    assert out["capabilities"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    assert out["support"] == {"refund": "optional", "job": "required", "echo": None}
    first = out["first"]
    assert first["status"] == "working" and out["repeatId"] == first["taskId"]
    assert out["polled"]["taskId"] == first["taskId"] and out["polled"]["status"] in ("working", "completed")
    assert out["result"]["structuredContent"]["order_id"] == "T-1" and out["result"]["isError"] is False
    assert out["result"]["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": first["taskId"]}
    assert out["done"]["status"] == "completed"
    assert first["taskId"] in out["listed"]
    assert out["cancelled"]["status"] == "cancelled" and out["afterCancel"]["status"] == "cancelled"
    assert out["cancelAgain"] == -32602
    assert out["kinds"][0] == "taskCreated" and out["kinds"][-1] == "result"
    assert out["jobResult"]["structuredContent"] == {"result": "job ts done"}
    # The TS client refuses a plain call of a task-required tool itself (-32600, before sending);
    # the server's own -32601 is tested with the Python client (tests/server/test_tasks.py).
    assert out["requiredPlain"] == -32600
    assert counts.count("pay T-1") == 1 and len(PaymentProvider(tmp_path / "ledger.db").effects(subject="T-1")) == 1
    assert counts.count("done T-2") == 0 and counts.count("job plain") == 0
