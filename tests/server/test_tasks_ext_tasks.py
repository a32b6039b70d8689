"""The `@modelcontextprotocol/ext-tasks` 0.2.2 requester (2026-07-28) against `mcp-durable serve` over HTTP.

The requester (`withTasks`) runs over a session port this test writes: 2026-07-28 streamable HTTP
is stateless JSON-RPC with the protocol version, client capabilities and client info in each
request's `_meta` and the `MCP-Protocol-Version` / `Mcp-Method` / `Mcp-Name` headers (the TS SDK
1.32 client speaks only 2025-11-25, and ext-tasks' own SDK adapter needs the SDK 2 client).
It creates a task (the server decides: the refund waits on a gate past its `task_after`), polls
it, settles it to the tool's result, cancels another, and repeats a create with the same key (while
it runs, and again after it finished: the same task both times).
"""

from __future__ import annotations

import json
from pathlib import Path

from mcp_durable.demo.ledger import PaymentProvider
from tests.helpers import serve_http
from tests.node_peers import NODE_MODULES, node_script, require_node_peers
from tests.server.servers.counting import Counter

TASKS = "tests/server/servers/tasks.py:make_server"

CLIENT = r"""
import { writeFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

// ES modules resolve bare names from the script's own folder (a temp dir): import by path instead.
const ext = (path) =>
  import(pathToFileURL(join(process.env.NODE_MODULES, '@modelcontextprotocol/ext-tasks/dist', path)).href);
const { withTasks } = await ext('client/session.js');

const [url, gates, counter] = process.argv.slice(2);
const VERSION = '2026-07-28';
const TASKS = 'io.modelcontextprotocol/tasks';
let nextId = 1;

// A ConnectedMcpSessionPort over stateless 2026-07-28 streamable HTTP.
async function dispatch(request, options = {}) {
  const params = request.params ?? {};
  const meta = params._meta ?? {};
  const capabilities = meta['io.modelcontextprotocol/clientCapabilities'] ?? {};
  const body = {
    jsonrpc: '2.0', id: nextId++, method: request.method,
    params: { ...params, _meta: { ...meta,
      'io.modelcontextprotocol/protocolVersion': VERSION,
      'io.modelcontextprotocol/clientInfo': { name: 'ext-tasks-requester', version: '0.2.2' },
      'io.modelcontextprotocol/clientCapabilities': { ...capabilities,
        extensions: { ...(capabilities.extensions ?? {}), [TASKS]: {} } } } },
  };
  const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream',
    'mcp-protocol-version': VERSION, 'mcp-method': request.method };
  const name = params.name ?? params.taskId;
  if (typeof name === 'string') headers['mcp-name'] = name;
  for (const [key, value] of Object.entries(options.context?.headers ?? {})) headers[key.toLowerCase()] = value;
  const response = await fetch(url, { method: 'POST', headers, body: JSON.stringify(body), signal: options.signal });
  const text = await response.text();
  let message;
  if ((response.headers.get('content-type') ?? '').includes('text/event-stream')) {
    for (const line of text.split('\n')) {
      if (!line.startsWith('data:')) continue;
      const parsed = JSON.parse(line.slice(5));
      if (parsed.id === body.id) message = parsed;
    }
  } else {
    message = JSON.parse(text);
  }
  if (message === undefined) throw new Error(`no response to ${request.method}: HTTP ${response.status} ${text}`);
  return message.error ? { kind: 'error', error: message.error } : { kind: 'result', result: message.result };
}

const port = {
  endpointId: url,
  taskCapabilities: { generation: 'v2', capabilities: {} },
  dispatch,
  onServerRequest: () => () => {},
  onNotification: () => () => {},
  onInvalidated: () => () => {},
  invalidated: false,
};
const session = withTasks(port, {});
const out = { capabilities: session.capabilities };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const KEY = { 'mcp-durable/idempotency-key': 'k-E-1' };

// Created by the server (not finished within task_after), repeated with the same key, polled, settled.
// The repeat comes from a second session, as a retrying client would send it (one session refuses
// to own one task twice, which is how it notices the server answered with the same task).
const first = await session.callTool('refund', { order_id: 'E-1', amount_cents: 100 }, { metadata: KEY });
const retrying = withTasks({ ...port }, {});
const repeat = await retrying.callTool('refund', { order_id: 'E-1', amount_cents: 100 }, { metadata: KEY });
out.kinds = [first.kind, repeat.kind];
out.ids = [first.handle?.taskId, repeat.handle?.taskId];
out.snapshot = (await session.task(first.handle.taskId).snapshot()).status;
writeFileSync(join(gates, 'E-1'), '');
const settled = await first.settle();
out.outcome = settled.outcome.status;
out.result = settled.outcome.result;
out.repeatOutcome = (await repeat.settle()).outcome.status;
await retrying.close();
// Repeated once more after it finished, from a third session: still the same task.
const late = withTasks({ ...port }, {});
const finished = await late.callTool('refund', { order_id: 'E-1', amount_cents: 100 }, { metadata: KEY });
out.lateKind = finished.kind;
out.lateId = finished.handle?.taskId;
out.lateOutcome = (await finished.settle()).outcome.status;
await late.close();

// Cancel a running task.
const doomed = await session.callTool('refund', { order_id: 'E-2', amount_cents: 200 });
out.doomedKind = doomed.kind;
const { readFileSync } = await import('node:fs');
while (!existsSync(counter) || !readFileSync(counter, 'utf8').includes('wait E-2')) await sleep(20);
await doomed.cancel();
out.cancelled = (await doomed.settle()).outcome.status;

// A task-required tool: always a task.
const job = await session.callTool('job', { name: 'ext' });
out.jobKind = job.kind;
out.job = (await job.settle()).outcome;
await session.close();
console.log(JSON.stringify(out));
"""


async def test_the_ext_tasks_requester_creates_polls_settles_and_cancels_tasks(tmp_path: Path) -> None:
    require_node_peers()
    gates = tmp_path / "gates"
    gates.mkdir()
    counter = tmp_path / "counter"
    env = {"COUNTER_FILE": str(counter), "TASK_GATE": str(gates), "PAYMENTS_LEDGER": str(tmp_path / "ledger.db")}
    async with serve_http(TASKS, journal=f"file://{tmp_path / 'journal'}", env=env) as served:
        run = node_script(
            tmp_path / "requester.mjs",
            CLIENT,
            args=[served.url, str(gates), str(counter)],
            timeout=60,
            env={"NODE_MODULES": str(NODE_MODULES)},
        )
        assert run.returncode == 0, run.stderr + served.stderr()
    out = json.loads(run.stdout.strip().splitlines()[-1])
    counts = Counter(counter)
    assert out["capabilities"]["cancellation"] is True
    assert out["kinds"] == ["task", "task"] and out["ids"][0] and out["ids"][0] == out["ids"][1]
    assert out["snapshot"] == "working"
    assert out["outcome"] == "completed" and out["repeatOutcome"] == "completed"
    assert out["lateKind"] == "task" and out["lateId"] == out["ids"][0] and out["lateOutcome"] == "completed"
    assert out["result"]["structuredContent"]["order_id"] == "E-1" and out["result"]["isError"] is False
    assert out["doomedKind"] == "task" and out["cancelled"] == "cancelled"
    assert out["jobKind"] == "task" and out["job"]["status"] == "completed"
    assert out["job"]["result"]["structuredContent"] == {"result": "job ext done"}
    assert counts.count("pay E-1") == 1 and len(PaymentProvider(tmp_path / "ledger.db").effects(subject="E-1")) == 1
    assert counts.count("done E-2") == 0
