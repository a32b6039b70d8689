"""A plain Python `MCPServer` as the upstream: over streamable HTTP behind the proxy, and made
durable in process by `mcp-durable serve plain.py --policies` / `make_durable(server, policies)`.

The upstream counts its executions in a file (`Counter`), so a test sees how often a tool ran.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from mcp_durable.errors import ConfigError
from mcp_durable.journal import CallQuery, create_journal
from tests.helpers import key_meta, resource_text, serve_cli_http, wire
from tests.proxy.upstreams import PLAIN_UPSTREAM, plain_http_upstream, proxy_cli, upstream_env
from tests.server.servers.counting import Counter

ERAS = ("legacy", "auto")


async def _durable_and_plain_calls(client: Client, counter: Counter) -> dict[str, Any]:
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert tools["record"].annotations is not None and tools["record"].annotations.idempotent_hint is True
    first = await client.call_tool("record", {"text": "a"}, meta=key_meta("k-1"))
    second = await client.call_tool("record", {"text": "a"}, meta=key_meta("k-1"))
    unkeyed_1 = await client.call_tool("record", {"text": "b"})
    unkeyed_2 = await client.call_tool("record", {"text": "b"})
    plain_1 = await client.call_tool("plain", {"text": "c"}, meta=key_meta("k-2"))
    plain_2 = await client.call_tool("plain", {"text": "c"}, meta=key_meta("k-2"))
    return {
        "first": first,
        "second": second,
        "unkeyed": (unkeyed_1, unkeyed_2),
        "plain": (plain_1, plain_2),
        "record_runs": counter.count("record"),
        "plain_runs": counter.count("plain"),
    }


def _check(seen: dict[str, Any]) -> None:
    first, second = seen["first"], seen["second"]
    assert seen["record_runs"] == 3  # k-1 once, and each call without a caller key
    assert first.meta["mcp-durable/key"] == "k-1" and "mcp-durable/replayed" not in first.meta
    assert second.meta["mcp-durable/replayed"] is True
    assert wire(second)["structuredContent"] == wire(first)["structuredContent"]
    # The upstream was sent the scoped key (`local` principal: the bare key).
    assert first.structured_content["key"] == "k-1"
    # Without a caller key an idempotent upstream tool is forwarded unjournaled every time: a key
    # derived from its arguments would answer a later, legitimate call with a stale result.
    for unkeyed in seen["unkeyed"]:
        assert unkeyed.meta is None or not {"mcp-durable/key", "mcp-durable/replayed"} & set(unkeyed.meta)
        assert unkeyed.structured_content["key"] is None  # the upstream was sent no key
    plain_1, plain_2 = seen["plain"]
    assert seen["plain_runs"] == 2  # pass-through: every call runs
    assert plain_1.structured_content["run"] != plain_2.structured_content["run"]
    assert plain_2.meta is None or "mcp-durable/key" not in plain_2.meta


@pytest.mark.parametrize("mode", ERAS)
async def test_a_python_upstream_over_http_runs_a_durable_tool_once_per_key(tmp_path: Path, mode: str) -> None:
    env = upstream_env(tmp_path)
    async with plain_http_upstream(env) as upstream:
        args = proxy_cli(["--upstream-url", upstream.url], f"file://{tmp_path}/journal")
        async with serve_cli_http(args, env=env) as proxy, Client(proxy.url, mode=mode) as client:
            seen = await _durable_and_plain_calls(client, Counter(env["COUNTER_FILE"]))
            reported: list[float] = []

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                reported.append(progress)

            done = await client.call_tool("progress", {"steps": 4}, progress_callback=on_progress)
            greeting = await client.read_resource("plain://greeting")
            prompt = await client.get_prompt("ask", {"topic": "journals"})
    _check(seen)
    assert wire(done)["content"][0]["text"] == "done 4" and reported == [1, 2, 3, 4]
    assert resource_text(greeting) == "hello from the plain upstream"
    assert prompt.messages[0].content.text == "Tell me about journals."  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", ERAS)
async def test_serve_policies_makes_the_plain_server_durable_in_process(tmp_path: Path, mode: str) -> None:
    env = upstream_env(tmp_path)
    policies = tmp_path / "policies.toml"
    # `record` is durable by its own annotation; the file makes `plain` pass-through explicitly.
    policies.write_text("[tools.plain]\ndurable = false\n\n[tools.record]\nretention = 3600\n")
    args = ["serve", PLAIN_UPSTREAM, "--journal", f"sqlite:///{tmp_path}/j.db", "--policies", str(policies)]
    async with serve_cli_http(args, env=env) as served, Client(served.url, mode=mode) as client:
        seen = await _durable_and_plain_calls(client, Counter(env["COUNTER_FILE"]))
        stats = json.loads(resource_text(await client.read_resource("journal://stats")))
    _check(seen)
    assert stats["retention"]["by_tool"]["record"] == 3600
    journal = create_journal(f"sqlite:///{tmp_path}/j.db")
    try:
        await journal.open()
        records = await journal.list_calls(CallQuery(limit=100))
    finally:
        await journal.aclose()
    assert [r.identity.tool for r in records] == ["record"]  # k-1; calls without a key are not journaled


async def test_make_durable_wraps_a_plain_server_object(tmp_path: Path) -> None:
    import os

    from mcp_durable.policy_file import parse_policies
    from mcp_durable.proxy import make_durable

    os.environ.update({"COUNTER_FILE": str(tmp_path / "counter"), "LEDGER_DB": str(tmp_path / "l.db")})
    from tests.proxy.servers.plain_upstream import server as plain

    durable = make_durable(plain, parse_policies('[tools.plain]\nkey = "caller"\n'), journal="memory://")
    counter = Counter(tmp_path / "counter")
    for mode in ERAS:
        async with Client(durable, mode=mode) as client:
            a = await client.call_tool("plain", {"text": "x"}, meta=key_meta(f"p-{mode}"))
            b = await client.call_tool("plain", {"text": "x"}, meta=key_meta(f"p-{mode}"))
            c = await client.call_tool("plain", {"text": "x"})  # `caller` mode: no key, not journaled
            assert b.meta is not None and b.meta["mcp-durable/replayed"] is True
            assert a.structured_content == b.structured_content
            assert c.meta is None or "mcp-durable/key" not in c.meta
    assert counter.count("plain") == 4  # one run per key in each era, plus the two unkeyed calls


def test_a_bad_policies_file_names_the_line_and_the_key(tmp_path: Path) -> None:
    from mcp_durable.cli.commands import main

    policies = tmp_path / "policies.toml"
    policies.write_text('[tools.record]\nkey = "derived"\n\n[tools.plain]\nwait = "soon"\n')
    with pytest.raises(ConfigError, match=r"policies.toml:5: tools\.plain\.wait"):
        from mcp_durable.policy_file import load_policies

        load_policies(policies)
    assert main(["serve", PLAIN_UPSTREAM, "--policies", str(policies), "--journal", "memory://"]) == 1
