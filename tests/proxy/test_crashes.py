"""SIGKILL around the proxy: the proxy killed mid-call, the upstream killed mid-call, no upstream.

Real subprocesses, killed with SIGKILL while a call is inside the upstream's tool (the tool waits
on a gate file the test opens, so no timing decides anything). The upstream counts its
executions in a file and keeps a sqlite ledger keyed by the forwarded key (`charge`).
"""

from __future__ import annotations

import functools
import os
import signal
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_durable.journal import CallQuery, CallState, create_journal
from mcp_durable.policy_file import parse_policies
from mcp_durable.proxy import ProxyServer, UpstreamSpec
from mcp_durable.proxy.upstream import QUIET_BEFORE_PING
from tests.helpers import first_text, free_port, key_meta, meta_of, serve_cli_http
from tests.proxy.upstreams import PLAIN_UPSTREAM, plain_http_upstream, plain_stdio_spec, proxy_cli, upstream_env
from tests.server.servers.counting import Counter

WAIT = 30.0


async def _until(check: Callable[[], bool], what: str) -> None:
    with anyio.fail_after(WAIT, shield=False):
        while not check():
            await anyio.sleep(0.02)
    assert check(), what


async def _call_in_background(tg: Any, call: Callable[[], Awaitable[Any]], outcome: list[Any]) -> None:
    async def run() -> None:
        try:
            outcome.append(await call())
        except Exception as exc:  # noqa: BLE001 - the proxy was killed under it
            outcome.append(exc)

    tg.start_soon(run)


async def _records(url: str) -> list[Any]:
    journal = create_journal(url)
    await journal.open()
    try:
        return await journal.list_calls(CallQuery(limit=100))
    finally:
        await journal.aclose()


async def test_a_proxy_killed_mid_call_never_runs_the_call_twice_upstream_under_refuse(tmp_path: Path) -> None:
    env = upstream_env(tmp_path)
    counter = Counter(env["COUNTER_FILE"])
    policies = tmp_path / "policies.toml"
    policies.write_text('[tools.gated]\nin_doubt = "refuse"\n')
    journal = f"file://{tmp_path}/journal"
    async with plain_http_upstream(env) as upstream:
        args = proxy_cli(["--upstream-url", upstream.url], journal, "--policies", str(policies))
        outcome: list[Any] = []
        async with serve_cli_http(args, env=env) as first:
            async with anyio.create_task_group() as tg, Client(first.url, mode="legacy") as client:
                await _call_in_background(
                    tg, lambda: client.call_tool("gated", {"text": "x"}, meta=key_meta("g-1")), outcome
                )
                await _until(lambda: counter.count("gated") == 1, "the call reached the upstream")
                first.kill()  # SIGKILL the proxy while the upstream runs the call
        counter.open_gate()
        await _until(lambda: counter.count("gated.done") == 1, "the upstream finished the orphaned call")
        async with serve_cli_http(args, env=env) as second, Client(second.url, mode="legacy") as client:
            for _ in range(2):
                again = await client.call_tool("gated", {"text": "x"}, meta=key_meta("g-1"))
                assert again.is_error and again.meta is not None
                assert again.meta["mcp-durable/error"]["error"] == "in_doubt"
    assert counter.count("gated") == 1  # never run twice upstream
    [record] = await _records(journal)
    assert record.state == CallState.IN_DOUBT


async def test_a_proxy_killed_mid_call_reaches_exactly_one_effect_under_retry_with_a_key_honouring_upstream(
    tmp_path: Path,
) -> None:
    env = upstream_env(tmp_path)
    counter = Counter(env["COUNTER_FILE"])
    policies = tmp_path / "policies.toml"
    policies.write_text('[tools.charge]\nkey = "required"\nin_doubt = "retry"\n')
    journal = f"sqlite:///{tmp_path}/proxy.db?single_writer=1"
    charge = {"order_id": "O-1", "amount_cents": 500}
    async with plain_http_upstream(env) as upstream:
        args = proxy_cli(["--upstream-url", upstream.url], journal, "--policies", str(policies))
        outcome: list[Any] = []
        async with serve_cli_http(args, env=env) as first:
            async with anyio.create_task_group() as tg, Client(first.url, mode="legacy") as client:
                await _call_in_background(tg, lambda: client.call_tool("charge", charge, meta=key_meta("c-1")), outcome)
                await _until(lambda: counter.count("charge") == 1, "the effect happened upstream")
                first.kill()  # inside the danger window: effect done, nothing journaled
        async with serve_cli_http(args, env=env) as second, Client(second.url, mode="legacy") as client:
            retried = await client.call_tool("charge", charge, meta=key_meta("c-1"))
            replayed = await client.call_tool("charge", charge, meta=key_meta("c-1"))
        counter.open_gate()
    assert not retried.is_error, retried
    assert retried.meta is not None and retried.meta["mcp-durable/key"] == "c-1"
    assert replayed.meta is not None and replayed.meta["mcp-durable/replayed"] is True
    assert counter.count("charge") == 1 and counter.count("charge.deduplicated") == 1
    db = sqlite3.connect(env["LEDGER_DB"])
    try:
        assert db.execute("SELECT key, order_id FROM charges").fetchall() == [("c-1", "O-1")]
    finally:
        db.close()


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_an_upstream_killed_mid_call_leaves_the_call_in_doubt_until_an_operator_resolves_it(
    tmp_path: Path, mode: str
) -> None:
    env = upstream_env(tmp_path)
    counter = Counter(env["COUNTER_FILE"])
    journal = f"sqlite:///{tmp_path}/proxy.db"
    proxy = ProxyServer(
        plain_stdio_spec(env),
        parse_policies('[tools.gated]\nin_doubt = "refuse"\n'),
        journal=journal,
        admin_principals=["local"],
    )
    async with Client(proxy, mode=mode) as client:
        outcome: list[Any] = []
        async with anyio.create_task_group() as tg:
            gated = functools.partial(client.call_tool, "gated", {"text": "x"}, meta=key_meta("g-1"))
            await _call_in_background(tg, gated, outcome)
            await _until(lambda: counter.count("gated") == 1, "the call reached the upstream")
            pid = int(counter.path.with_name(counter.path.name + ".pid").read_text())
            os.kill(pid, signal.SIGKILL)
        [answer] = outcome
        assert not isinstance(answer, Exception), answer
        assert answer.is_error and answer.meta["mcp-durable/error"]["error"] == "in_doubt"  # never a silent success
        again = await client.call_tool("gated", {"text": "x"}, meta=key_meta("g-1"))
        assert meta_of(again)["mcp-durable/error"]["error"] == "in_doubt"
        # The proxy restarted its stdio upstream and keeps serving.
        fine = await client.call_tool("record", {"text": "after"}, meta=key_meta("r-after"))
        assert not fine.is_error and counter.count("record") == 1
        states = {r.identity.tool: r.state for r in await _records(journal)}
        assert states == {"gated": CallState.IN_DOUBT, "record": CallState.COMPLETED}
        assert counter.count("gated") == 1 and counter.count("gated.done") == 0
        # An operator, through the proxy's own admin tool, finds the effect did not happen.
        tools = {tool.name for tool in (await client.list_tools()).tools}
        assert {"journal_resolve", "journal_purge_expired"} <= tools
        verdict = {"tool": "gated", "key": "g-1", "resolution": "not_applied"}
        resolved = await client.call_tool("journal_resolve", verdict)
        assert not resolved.is_error, resolved
        counter.open_gate()
        rerun = await client.call_tool("gated", {"text": "x"}, meta=key_meta("g-1"))
    assert not rerun.is_error and counter.count("gated") == 2 and counter.count("gated.done") == 1
    states = {r.identity.tool: r.state for r in await _records(journal)}
    assert states == {"gated": CallState.COMPLETED, "record": CallState.COMPLETED}


async def test_an_http_upstream_killed_mid_call_leaves_the_call_in_doubt(tmp_path: Path) -> None:
    env = upstream_env(tmp_path)
    counter = Counter(env["COUNTER_FILE"])
    journal = f"sqlite:///{tmp_path}/proxy.db"
    async with plain_http_upstream(env) as upstream:
        proxy = ProxyServer(UpstreamSpec(url=upstream.url), journal=journal)
        async with Client(proxy, mode="legacy") as client:
            outcome: list[Any] = []
            async with anyio.create_task_group() as tg:
                gated = functools.partial(client.call_tool, "gated", {"text": "x"}, meta=key_meta("g-1"))
                await _call_in_background(tg, gated, outcome)
                await _until(lambda: counter.count("gated") == 1, "the call reached the upstream")
                upstream.kill()
    [answer] = outcome
    assert not isinstance(answer, Exception), answer
    assert answer.is_error and answer.meta["mcp-durable/error"]["error"] == "in_doubt"
    [record] = await _records(journal)
    assert record.state == CallState.IN_DOUBT


@pytest.mark.parametrize("where", ["url", "command"])
async def test_an_unreachable_upstream_gives_a_clear_error_and_journals_nothing(tmp_path: Path, where: str) -> None:
    journal = f"sqlite:///{tmp_path}/proxy.db"
    if where == "url":
        spec = UpstreamSpec(url=f"http://127.0.0.1:{free_port()}/mcp", connect_timeout=10)
    else:
        spec = UpstreamSpec(command=[str(tmp_path / "no-such-server")], connect_timeout=10)
    proxy = ProxyServer(spec, journal=journal)
    async with Client(proxy, mode="legacy") as client:
        answer = await client.call_tool("record", {"text": "x"}, meta=key_meta("k-1"))
    assert answer.is_error and answer.meta is not None
    assert answer.meta["mcp-durable/error"]["error"] == "upstream_unavailable"
    assert "cannot be reached" in first_text(answer)
    assert await _records(journal) == []


async def test_an_http_upstream_that_died_while_idle_is_refused_as_unavailable_and_reconnected_when_back(
    tmp_path: Path,
) -> None:
    env = upstream_env(tmp_path)
    counter = Counter(env["COUNTER_FILE"])
    journal = f"sqlite:///{tmp_path}/proxy.db"
    async with plain_http_upstream(env) as upstream:
        port = upstream.port
        proxy = ProxyServer(UpstreamSpec(url=upstream.url, connect_timeout=10), journal=journal)
        async with Client(proxy, mode="legacy") as client:
            first = await client.call_tool("record", {"text": "a"}, meta=key_meta("r-a"))
            upstream.kill()
            # Quiet for longer than QUIET_BEFORE_PING, so the proxy checks the session before
            # the next durable call (an ordering, not a timed assertion).
            await anyio.sleep(QUIET_BEFORE_PING + 0.2)
            refused = await client.call_tool("record", {"text": "b"}, meta=key_meta("r-b"))
            async with serve_cli_http(["serve", PLAIN_UPSTREAM], env=env, port=port):
                back = await client.call_tool("record", {"text": "c"}, meta=key_meta("r-c"))
    assert not first.is_error and not back.is_error
    assert refused.is_error and meta_of(refused)["mcp-durable/error"]["error"] == "upstream_unavailable"
    assert "ConnectError" in meta_of(refused)["mcp-durable/error"]["message"]
    assert counter.count("record") == 2
    assert sorted(r.state for r in await _records(journal)) == [CallState.COMPLETED, CallState.COMPLETED]
