"""A proxied tool's task survives a SIGKILL of the proxy: the task id still answers after a restart,
and the tool's in-doubt policy settles it with no second effect upstream.

The proxy is `mcp-durable proxy` over HTTP (a subprocess, SIGKILLed while the upstream runs the
task's call); the upstream is the plain Python upstream over HTTP (another subprocess, which lives
on). Its `charge` honours the forwarded key: the first call with a key inserts a ledger row (the
effect) and waits for the gate; a call with a key already in the ledger returns that row.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from mcp import Client

from mcp_durable.journal import CallQuery, CallState, create_journal
from mcp_durable.policy_file import parse_policies
from mcp_durable.proxy import ProxyServer
from tests.helpers import serve_cli_http
from tests.proxy.task_clients import ERAS, create_task, task_result, tasks_client
from tests.proxy.upstreams import plain_http_upstream, plain_stdio_spec, proxy_cli, upstream_env
from tests.server.servers.counting import Counter
from tests.server.task_client import poll_until_terminal, request

CHARGE = {"order_id": "O-1", "amount_cents": 500}


def _policies(tmp_path: Path, in_doubt: str) -> Path:
    path = tmp_path / "policies.toml"
    path.write_text(
        f'[tools.charge]\nkey = "required"\nin_doubt = "{in_doubt}"\ntask_support = "optional"\ntask_after = 0\n'
    )
    return path


async def _until(check: Callable[[], bool], what: str) -> None:
    with anyio.fail_after(30):
        while not check():
            await anyio.sleep(0.02)
    assert check(), what


def _ledger(path: str) -> list[tuple[str, str]]:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT key, order_id FROM charges").fetchall()
    finally:
        db.close()


async def _states(url: str) -> list[CallState]:
    journal = create_journal(url)
    await journal.open()
    try:
        return [record.state for record in await journal.list_calls(CallQuery(limit=100))]
    finally:
        await journal.aclose()


@pytest.mark.parametrize("era", ERAS)
async def test_a_killed_proxys_task_is_resumed_at_start_with_one_effect_upstream(tmp_path: Path, era: str) -> None:
    env = upstream_env(tmp_path)
    counter = Counter(env["COUNTER_FILE"])
    journal = f"file://{tmp_path}/journal"
    async with plain_http_upstream(env) as upstream:
        args = proxy_cli(["--upstream-url", upstream.url], journal, "--policies", str(_policies(tmp_path, "retry")))
        async with serve_cli_http(args, env=env) as first:
            async with tasks_client(first.url, era) as client:
                task_id = await create_task(client, era, "charge", CHARGE, key="c-1")
            await _until(lambda: counter.count("charge") == 1, "the effect happened upstream")
            first.kill()  # the upstream's call is in flight: effect done, nothing journaled
        async with serve_cli_http(args, env=env) as second:
            # Resumed at start, before any request: the call forwarded again with the same key.
            await _until(lambda: counter.count("charge.deduplicated") == 1, "the task was resumed")
            async with tasks_client(second.url, era) as client:
                result = await task_result(client, era, task_id)
                done = await request(client, "tasks/get", {"taskId": task_id})
                repeated = await create_task(client, era, "charge", CHARGE, key="c-1")
        counter.open_gate()  # the first proxy's orphaned call ends upstream
    assert done["status"] == "completed" and repeated == task_id
    assert result["isError"] is False and result["structuredContent"] == {**CHARGE, "key": "c-1"}
    assert counter.count("charge") == 1 and counter.count("charge.deduplicated") == 1
    assert _ledger(env["LEDGER_DB"]) == [("c-1", "O-1")]  # one effect


async def test_under_refuse_a_killed_proxys_task_ends_failed_in_doubt_and_never_runs_again(tmp_path: Path) -> None:
    env = upstream_env(tmp_path)
    counter = Counter(env["COUNTER_FILE"])
    journal = f"file://{tmp_path}/journal"
    async with plain_http_upstream(env) as upstream:
        args = proxy_cli(["--upstream-url", upstream.url], journal, "--policies", str(_policies(tmp_path, "refuse")))
        async with serve_cli_http(args, env=env) as first:
            async with tasks_client(first.url, "legacy") as client:
                task_id = await create_task(client, "legacy", "charge", CHARGE, key="c-1")
            await _until(lambda: counter.count("charge") == 1, "the call reached the upstream")
            first.kill()
        counter.open_gate()
        async with serve_cli_http(args, env=env) as second, tasks_client(second.url, "legacy") as client:
            ended = await poll_until_terminal(client, task_id)
            result = await request(client, "tasks/result", {"taskId": task_id})
            repeated = await create_task(client, "legacy", "charge", CHARGE, key="c-1")
    assert ended["status"] == "failed" and "in_doubt" in ended["statusMessage"]
    assert result["isError"] is True and result["_meta"]["mcp-durable/error"]["error"] == "in_doubt"
    assert repeated == task_id
    assert counter.count("charge") == 1 and counter.count("charge.deduplicated") == 0  # not sent again
    assert await _states(journal) == [CallState.IN_DOUBT]  # for an operator


async def test_a_task_cut_off_by_the_last_connection_closing_is_resumed_when_the_next_one_opens(tmp_path: Path) -> None:
    """In process: the proxy stops its engine and its upstream when its last connection closes, and
    starts both again with the next; the task the first left in doubt is resumed at that start."""
    env = upstream_env(tmp_path)
    counter = Counter(env["COUNTER_FILE"])
    policies = parse_policies(_policies(tmp_path, "retry").read_text())
    proxy = ProxyServer(plain_stdio_spec(env), policies, journal=f"file://{tmp_path}/journal")
    async with Client(proxy, mode="legacy") as client:
        task_id = await create_task(client, "legacy", "charge", CHARGE, key="c-1")
        await _until(lambda: counter.count("charge") == 1, "the effect happened upstream")
    async with Client(proxy, mode="legacy") as client:
        # Resumed at the start, before any request: the call forwarded again with the same key.
        await _until(lambda: counter.count("charge.deduplicated") == 1, "the task was resumed")
        result = await task_result(client, "legacy", task_id)
    assert result["isError"] is False and result["structuredContent"] == {**CHARGE, "key": "c-1"}
    assert counter.count("charge") == 1
    assert _ledger(env["LEDGER_DB"]) == [("c-1", "O-1")]
