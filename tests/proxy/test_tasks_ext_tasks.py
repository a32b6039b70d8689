"""The `@modelcontextprotocol/ext-tasks` 0.2.2 requester (2026-07-28) against `mcp-durable proxy` over
HTTP, in front of the plain Python upstream (over HTTP): the proxy's own tasks of proxied tools, as
a client of the tasks extension written on another SDK meets them; and (target `fastmcp`) against
the same tools on a durable FastMCP server (tests/fastmcp/clients_app.py), whose tasks
`DurableTasks` serves.

The requester runs over the session port of tests/server/test_tasks_ext_tasks.py (stateless
2026-07-28 streamable HTTP, written there once and reused here). `charge` (it honours the forwarded
key; a first call waits for the gate) is task-optional with `task_after = 0`, so the proxy answers
with a task: a repeat of its key from another session while it runs, and again after it finished,
gets the same task, and the upstream makes one effect. `flaky` (its first execution crashes, which
the upstream answers with an `isError` result) is task-optional under the proxy's default
`tool_errors = "release"`: its task is `completed` with the error result, and a repeat of its key
runs again as a new task. On FastMCP `flaky` raises (released by the default
`exceptions="release"`): its task is `failed`, and a repeat of its key runs again as a new task.
"""

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
from tests.server.test_tasks_ext_tasks import CLIENT as SERVER_CLIENT

POLICIES = """\
[tools.charge]
key = "required"
task_support = "optional"
task_after = 0

[tools.flaky]
task_support = "optional"
task_after = 0
"""

#: Where the server test's requester begins its own scenario: what comes before is the session port.
PORT_ENDS = "const session = withTasks(port, {});"
assert PORT_ENDS in SERVER_CLIENT, "tests/server/test_tasks_ext_tasks.py's requester changed: update PORT_ENDS"

SCENARIO = r"""
const session = withTasks(port, {});
const out = { capabilities: session.capabilities };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const { readFileSync } = await import('node:fs');
const lines = () => (existsSync(counter) ? readFileSync(counter, 'utf8').split('\n') : []);
const hits = (event) => lines().filter((l) => l === event).length;
const KEY = { 'mcp-durable/idempotency-key': 'k-X-1' };
const CHARGE = { order_id: 'X-1', amount_cents: 100 };

// Created by the proxy (task_after = 0); repeated with the same key from a second session while the
// upstream runs it (one session refuses to own one task twice), polled, settled.
const first = await session.callTool('charge', CHARGE, { metadata: KEY });
while (hits('charge') === 0) await sleep(20);
const retrying = withTasks({ ...port }, {});
const repeat = await retrying.callTool('charge', CHARGE, { metadata: KEY });
out.kinds = [first.kind, repeat.kind];
out.ids = [first.handle?.taskId, repeat.handle?.taskId];
out.snapshot = (await session.task(first.handle.taskId).snapshot()).status;
writeFileSync(counter + '.gate', '');
const settled = await first.settle();
out.outcome = settled.outcome.status;
out.result = settled.outcome.result;
out.repeatOutcome = (await repeat.settle()).outcome.status;
await retrying.close();
// Repeated once more after it finished, from a third session: still the same task.
const late = withTasks({ ...port }, {});
const finished = await late.callTool('charge', CHARGE, { metadata: KEY });
out.lateKind = finished.kind;
out.lateId = finished.handle?.taskId;
out.lateOutcome = (await finished.settle()).outcome;
await late.close();

// An upstream error result, released by the proxy's default: the task's result all the same.
const FLAKY = { 'mcp-durable/idempotency-key': 'k-F-1' };
const crashed = await session.callTool('flaky', { text: 'x' }, { metadata: FLAKY });
out.crashedKind = crashed.kind;
out.crashed = (await crashed.settle()).outcome;
const again = withTasks({ ...port }, {});
const retried = await again.callTool('flaky', { text: 'x' }, { metadata: FLAKY });
out.retriedKind = retried.kind;
out.retriedIds = [crashed.handle?.taskId, retried.handle?.taskId];
out.retried = (await retried.settle()).outcome;
await again.close();
await session.close();
console.log(JSON.stringify(out));
"""


@asynccontextmanager
async def _served(target: str, tmp_path: Path, env: dict[str, str]) -> AsyncIterator[ServedUrl]:
    """The tools served with tasks by `target`: the proxy in front of the plain upstream (its
    policies `POLICIES`), or the same tools on a durable FastMCP server (`clients_app`)."""
    journal = f"file://{tmp_path}/journal"
    if target == "fastmcp":
        from tests.fastmcp.clients_app import clients_app

        async with serve_app(clients_app(journal, env, task_after=0).http_app()) as base:
            yield ServedUrl(f"{base}/mcp", lambda: "")
        return
    policies = tmp_path / "policies.toml"
    policies.write_text(POLICIES)
    async with plain_http_upstream(env) as upstream:
        args = proxy_cli(["--upstream-url", upstream.url], journal, "--policies", str(policies))
        async with serve_cli_http(args, env=env) as proxy:
            yield ServedUrl(proxy.url, proxy.stderr)


@pytest.mark.parametrize("target", TARGETS)
async def test_the_ext_tasks_requester_gets_the_same_task_on_a_repeat(target: str, tmp_path: Path) -> None:
    require_node_peers()
    env = upstream_env(tmp_path)
    counter = Counter(env["COUNTER_FILE"])
    source = SERVER_CLIENT.split(PORT_ENDS)[0] + SCENARIO
    async with _served(target, tmp_path, env) as served:
        run = await anyio.to_thread.run_sync(
            lambda: node_script(
                tmp_path / "requester.mjs",
                source,
                args=[served.url, str(tmp_path), str(counter.path)],
                timeout=90,
                env={"NODE_MODULES": str(NODE_MODULES)},
            )
        )
        assert run.returncode == 0, run.stderr + served.stderr()
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["capabilities"]["cancellation"] is True
    # One task per key, running or finished, and one effect upstream.
    assert out["kinds"] == ["task", "task"] and out["ids"][0] and out["ids"][0] == out["ids"][1]
    assert out["snapshot"] == "working"
    assert out["outcome"] == "completed" and out["repeatOutcome"] == "completed"
    assert out["result"]["isError"] is False
    assert out["result"]["structuredContent"] == {"order_id": "X-1", "amount_cents": 100, "key": "k-X-1"}
    assert out["lateKind"] == "task" and out["lateId"] == out["ids"][0]
    assert out["lateOutcome"]["status"] == "completed" and out["lateOutcome"]["result"] == out["result"]
    assert counter.count("charge") == 1 and counter.count("charge.deduplicated") == 0
    # The proxy: the upstream's error result, released, is the first task's result. FastMCP: the
    # raised exception, released (`exceptions="release"`), fails the first task. Either way the
    # repeat of the key ran again, as a new task.
    assert out["crashedKind"] == "task"
    if target == "proxy":
        assert out["crashed"]["status"] == "completed" and out["crashed"]["result"]["isError"] is True
        assert "Error executing tool flaky" in out["crashed"]["result"]["content"][0]["text"]
    else:
        assert out["crashed"]["status"] == "failed" and out["crashed"]["error"]["name"] == "TaskFailedError"
        assert "flaky crashed on its first execution" in out["crashed"]["task"]["statusMessage"]
    assert out["retriedKind"] == "task" and out["retriedIds"][0] != out["retriedIds"][1]
    assert out["retried"]["status"] == "completed" and out["retried"]["result"]["isError"] is False
    assert counter.count("flaky") == 2
