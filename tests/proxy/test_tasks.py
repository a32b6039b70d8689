"""MCP tasks of proxied tools, served by the proxy itself (docs/proxy.md, "Tasks"), in both eras.

A durable tool given `task_support` by the policies file (or declared `optional` by the upstream
itself) is advertised with it; a task of it is a journaled call of the proxy whose run forwards a
plain `tools/call` upstream in the background, with the scoped key: a repeat of the key gets the
same task and the upstream runs the call once. The upstreams are real servers in subprocesses (the
plain Python upstream over stdio or HTTP, a `DurableServer` serving tasks of its own over HTTP);
the clients are real MCP clients, in process or over streamable HTTP.
"""

from __future__ import annotations

import logging
import shlex
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, MCPError
from mcp_types import CreateMessageResult, TextContent

from mcp_durable.journal import CallQuery, create_journal
from mcp_durable.policy_file import parse_policies
from mcp_durable.proxy import ProxyServer, UpstreamSpec
from mcp_durable.proxy.upstream import QUIET_BEFORE_PING
from mcp_durable.server.tasks import TASK_NOT_FOUND
from tests.helpers import serve_cli_http, serve_http
from tests.node_peers import package_bin, require_node_peers
from tests.proxy.task_clients import ERAS, client_kwargs, create_task, task_result, tasks_client
from tests.proxy.upstreams import EVERYTHING, plain_http_upstream, plain_stdio_spec, proxy_cli, upstream_env
from tests.server.servers.counting import Counter
from tests.server.task_client import create_legacy_task, poll_until_terminal, request

#: `charge` of the plain upstream (it honours the forwarded key; a first call waits for the gate)
#: made a task-capable durable tool; `task_after = 0`: a 2026-07-28 call is answered with a task.
CHARGE_TASKS = '[tools.charge]\nkey = "required"\ntask_support = "optional"\ntask_after = 0\n'
CHARGE = {"order_id": "O-1", "amount_cents": 500}
#: The `DurableServer` of tests/server/test_tasks.py: `refund` task-optional, `job` task-required.
TASKS_UPSTREAM = "tests/server/servers/tasks.py:make_server"


async def _until(check: Any, what: str) -> None:
    with anyio.fail_after(30):
        while not check():
            await anyio.sleep(0.02)
    assert check(), what


async def _keys(url: str) -> list[str]:
    journal = create_journal(url)
    await journal.open()
    try:
        return sorted(record.identity.key for record in await journal.list_calls(CallQuery(limit=100)))
    finally:
        await journal.aclose()


def _support(listed: dict[str, Any]) -> dict[str, str | None]:
    return {tool["name"]: tool.get("execution", {}).get("taskSupport") for tool in listed["tools"]}


async def test_the_proxy_advertises_the_task_support_it_serves_and_keeps_what_the_upstream_declared_where_it_can(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "gates").mkdir()
    (tmp_path / "gates" / "O-1").touch()  # the upstream's refund finishes at once
    counter = Counter(tmp_path / "counter")
    env = {
        "COUNTER_FILE": str(counter.path),
        "TASK_GATE": str(tmp_path / "gates"),
        "PAYMENTS_LEDGER": str(tmp_path / "ledger.db"),
    }
    async with serve_http(TASKS_UPSTREAM, journal=f"sqlite:///{tmp_path}/upstream.db", env=env) as upstream:
        spec = UpstreamSpec(url=upstream.url)
        policies = parse_policies('[tools.echo]\ntask_support = "required"\n')
        proxy = ProxyServer(spec, policies, journal=f"sqlite:///{tmp_path}/proxy.db")
        with caplog.at_level(logging.WARNING, logger="mcp_durable.proxy.server"):
            async with Client(proxy, mode="legacy") as client:
                assert client.server_capabilities.tasks is not None
                served = _support(await request(client, "tools/list", {}))
                with pytest.raises(MCPError) as plain_job:  # a plain call of a task-required tool
                    await client.call_tool("job", {"name": "j"})
                # Run as the upstream's own task, once per key: a repeat gets the proxy's same task.
                job_tasks = [await create_task(client, "legacy", "job", {"name": "j"}, key="job-key") for _ in range(2)]
                job_done = await task_result(client, "legacy", job_tasks[0])
                task_id = await create_task(client, "legacy", "refund", {"order_id": "O-1", "amount_cents": 5})
                refunded = await task_result(client, "legacy", task_id)
        forbidden = parse_policies('[tools.refund]\ntask_support = "forbidden"\n')
        proxy = ProxyServer(spec, forbidden, journal="memory://")
        async with Client(proxy, mode="legacy") as client:
            without = _support(await request(client, "tools/list", {}))
            with pytest.raises(MCPError) as refund:
                await create_legacy_task(client, "refund", {"order_id": "O-1", "amount_cents": 5})
    # refund: the upstream's `optional`, kept (the proxy serves it: a plain call of it is valid
    # upstream); echo: the policies file's; job: the upstream's `required`, kept (the proxy's task
    # runs it as the upstream's own task), so a plain call of it is refused as the upstream would.
    assert served["refund"] == "optional" and served["echo"] == "required" and served["job"] == "required"
    assert plain_job.value.error.code == -32601 and "requires task augmentation" in plain_job.value.error.message
    assert not any("runs only as an MCP task" in r.getMessage() for r in caplog.records)
    assert job_tasks[0] == job_tasks[1] and job_done["content"][0]["text"] == "job j done"
    assert counter.count("job j") == 1
    # The proxy's task forwarded one plain call, which the upstream ran once.
    assert refunded["isError"] is False and refunded["structuredContent"]["order_id"] == "O-1"
    assert counter.count("pay O-1") == 1 and counter.count("done O-1") == 1
    assert without["refund"] is None and refund.value.error.code == -32601  # the file's "forbidden" wins


@pytest.mark.parametrize("era", ERAS)
async def test_a_task_runs_once_upstream_and_every_repeat_of_its_key_gets_the_same_task(
    tmp_path: Path, era: str
) -> None:
    env = upstream_env(tmp_path)
    counter = Counter(env["COUNTER_FILE"])
    proxy = ProxyServer(plain_stdio_spec(env), parse_policies(CHARGE_TASKS), journal=f"file://{tmp_path}/journal")
    async with Client(proxy, **client_kwargs(era)) as client:
        task_id = await create_task(client, era, "charge", CHARGE, key="c-1")
        await _until(lambda: counter.count("charge") == 1, "the call reached the upstream")
        running = await create_task(client, era, "charge", CHARGE, key="c-1")
        polled = await request(client, "tasks/get", {"taskId": task_id})
        counter.open_gate()
        result = await task_result(client, era, task_id)
        done = await request(client, "tasks/get", {"taskId": task_id})
        finished = await create_task(client, era, "charge", CHARGE, key="c-1")
        listed = await request(client, "tasks/list", {}) if era == "legacy" else None
    assert running == task_id and finished == task_id  # the same key: the same task, running or done
    assert polled["status"] == "working" and done["status"] == "completed"
    assert result["isError"] is False
    assert result["structuredContent"] == {**CHARGE, "key": "c-1"}  # the scoped key went upstream
    assert counter.count("charge") == 1 and counter.count("charge.deduplicated") == 0  # one upstream call
    if listed is not None:
        assert [task["taskId"] for task in listed["tasks"]] == [task_id]


@pytest.mark.parametrize("era", ERAS)
async def test_while_the_upstream_is_down_a_task_is_refused_before_any_claim_unless_the_journal_answers_its_key(
    tmp_path: Path, era: str
) -> None:
    env = upstream_env(tmp_path)
    counter = Counter(env["COUNTER_FILE"])
    counter.open_gate()  # charge finishes at once
    journal = f"sqlite:///{tmp_path}/proxy.db"
    async with plain_http_upstream(env) as upstream:
        proxy = ProxyServer(
            UpstreamSpec(url=upstream.url, connect_timeout=10), parse_policies(CHARGE_TASKS), journal=journal
        )
        async with Client(proxy, **client_kwargs(era)) as client:
            task_id = await create_task(client, era, "charge", CHARGE, key="k-1")
            assert (await poll_until_terminal(client, task_id))["status"] == "completed"
            upstream.kill()
            # Quiet for longer than QUIET_BEFORE_PING, so the proxy checks the session before the
            # next task and finds it dead (an ordering, not a timed assertion).
            await anyio.sleep(QUIET_BEFORE_PING + 0.2)
            repeated = await create_task(client, era, "charge", CHARGE, key="k-1")
            with pytest.raises(MCPError) as refused:
                await create_task(client, era, "charge", {**CHARGE, "order_id": "O-2"}, key="k-2")
            again = await create_task(client, era, "charge", CHARGE, key="k-1")
            result = await task_result(client, era, task_id)
    assert repeated == task_id and again == task_id  # answered by the journal, without the upstream
    assert result["structuredContent"]["key"] == "k-1"
    assert refused.value.error.data["error"] == "upstream_unavailable"
    assert await _keys(journal) == ["k-1"]  # the refused task claimed nothing
    assert counter.count("charge") == 1


async def test_an_upstream_request_made_during_a_background_task_reaches_no_client(tmp_path: Path) -> None:
    """A task's call has no client: it runs through the upstream session that declares no
    capabilities, so a sampling request the upstream sends all the same gets the answer of a
    client without sampling, even while another client's call (one that can sample) is the only
    other one in flight."""
    env = upstream_env(tmp_path)
    counter = Counter(env["COUNTER_FILE"])
    asked: list[str] = []

    async def sampler(context: object, params: Any) -> CreateMessageResult:
        asked.append(params.messages[0].content.text)
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="from b"), model="m")

    policies = parse_policies('[tools.ask_client]\nkey = "required"\ntask_support = "required"\n')
    proxy = ProxyServer(plain_stdio_spec(env), policies, journal="memory://")
    async with (
        Client(proxy, mode="legacy") as a,
        Client(proxy, mode="legacy", sampling_callback=sampler) as b,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(b.call_tool, "stall", {"text": "hold"})  # b's call, in flight throughout
        await _until(lambda: counter.count("stall") == 1, "b's call reached the upstream")
        task_id = await create_task(a, "legacy", "ask_client", {"prompt": "whose?"}, key="a-1")
        ended = await poll_until_terminal(a, task_id)
        counter.open_gate()
    assert asked == []  # never sent to b
    assert ended["status"] == "failed"
    assert "Sampling not supported" in ended.get("statusMessage", "")  # as a client without sampling


@pytest.mark.parametrize("era", ERAS)
async def test_two_principals_over_http_never_see_each_others_tasks(tmp_path: Path, era: str) -> None:
    env = upstream_env(tmp_path)
    counter = Counter(env["COUNTER_FILE"])
    counter.open_gate()
    policies = tmp_path / "policies.toml"
    policies.write_text(CHARGE_TASKS)
    async with plain_http_upstream(env) as upstream:
        args = proxy_cli(["--upstream-url", upstream.url], f"file://{tmp_path}/journal", "--policies", str(policies))
        async with serve_cli_http(args, env={**env, "MCP_DURABLE_TOKENS": "tokA=alice,tokB=bob"}) as proxy:
            async with tasks_client(proxy.url, era, "tokA") as alice:
                alices = await create_task(alice, era, "charge", CHARGE, key="shared")
                alice_result = await task_result(alice, era, alices)
            async with tasks_client(proxy.url, era, "tokB") as bob:
                refused: dict[str, MCPError] = {}
                for method in ("tasks/get", "tasks/cancel") + (("tasks/result",) if era == "legacy" else ()):
                    with pytest.raises(MCPError) as error:
                        await request(bob, method, {"taskId": alices})
                    refused[method] = error.value
                bobs = await create_task(bob, era, "charge", CHARGE, key="shared")
                bob_result = await task_result(bob, era, bobs)
                listed = await request(bob, "tasks/list", {}) if era == "legacy" else None
    for method, answer in refused.items():  # exactly the error of an unknown task id
        assert (answer.error.code, answer.error.message) == (-32602, TASK_NOT_FOUND), method
    assert bobs != alices
    assert alice_result["structuredContent"]["key"] == "alice:shared"  # each principal's scoped key
    assert bob_result["structuredContent"]["key"] == "bob:shared"
    assert counter.count("charge") == 2  # one call per principal, never an answer across them
    if listed is not None:
        assert [task["taskId"] for task in listed["tasks"]] == [bobs]


async def test_server_everythings_task_only_tool_runs_as_its_own_task_once_per_key(tmp_path: Path) -> None:
    """server-everything serves `simulate-research-query` only as a task (`taskSupport:
    required`, 2025-11-25 tasks): made durable by the policies file, the proxy lists it as such
    and runs each of its tasks as the upstream's own task, once per key, for a client of either
    era (each a key of its own; a repeat of the key is the same task)."""
    require_node_peers()
    policies = tmp_path / "policies.toml"
    policies.write_text('[tools.simulate-research-query]\nkey = "required"\n')
    upstream = ["--upstream-command", shlex.join(package_bin(EVERYTHING)), "--policies", str(policies)]
    args = proxy_cli(upstream, f"file://{tmp_path}/journal")
    tasks: dict[str, list[str]] = {}
    async with serve_cli_http(args) as served:
        for era in ERAS:
            topic = {"topic": f"ducks in {era}"}
            async with tasks_client(served.url, era) as client:
                listed = _support(await request(client, "tools/list", {}))
                first = await create_task(client, era, "simulate-research-query", topic, key=f"research-{era}")
                report = await task_result(client, era, first)
                again = await create_task(client, era, "simulate-research-query", topic, key=f"research-{era}")
            tasks[era] = [first, again]
            assert listed["simulate-research-query"] == (
                "required" if era == "legacy" else None
            )  # 2026-07-28 lists none
            assert report["isError"] is False and f"# Research Report: ducks in {era}" in report["content"][0]["text"]
    keys = await _keys(f"file://{tmp_path}/journal")
    assert all(first == again for first, again in tasks.values())  # a repeat of the key: the same task
    assert keys == sorted(f"research-{era}" for era in ERAS)  # one record per key, so one run upstream


async def test_cancelling_the_proxys_task_of_a_task_only_tool_cancels_the_upstreams_own_task(tmp_path: Path) -> None:
    (tmp_path / "gates").mkdir()
    counter = Counter(tmp_path / "counter")
    env = {"COUNTER_FILE": str(counter.path), "TASK_GATE": str(tmp_path / "gates")}
    async with serve_http(TASKS_UPSTREAM, journal=f"sqlite:///{tmp_path}/upstream.db", env=env) as upstream:
        proxy = ProxyServer(UpstreamSpec(url=upstream.url), parse_policies(""), journal="memory://")
        async with Client(proxy, mode="legacy") as client:
            task_id = await create_task(client, "legacy", "job", {"name": "wait-1"}, key="wait-1")
            await _until(lambda: counter.count("job wait-1") == 1, "the upstream's task to start")
            await request(client, "tasks/cancel", {"taskId": task_id})
            await _until(lambda: counter.count("stopped job wait-1") == 1, "the upstream's task to be cancelled")
            task = await request(client, "tasks/get", {"taskId": task_id})
    assert task["status"] == "cancelled"
    assert counter.count("job wait-1") == 1
