"""The proxy over HTTP with two bearer-token principals: records, replays and journal resources
are scoped by principal; the upstream gets each principal's scoped key; no secret reaches the
upstream (neither the proxy's token map nor the upstream token in a stdio child's environment).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import CreateMessageResult, TextContent

from mcp_durable.proxy import ProxyServer
from tests.helpers import client_as, key_meta, meta_of, resource_text, serve_cli_http, wire
from tests.node_peers import package_bin
from tests.proxy.upstreams import (
    EVERYTHING,
    PLAIN_UPSTREAM,
    plain_http_upstream,
    plain_stdio_spec,
    proxy_cli,
    upstream_env,
)
from tests.server.servers.counting import Counter

TOKENS = "tokA=alice,tokB=bob"


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_one_principals_records_and_replays_are_never_visible_to_the_other(tmp_path: Path, mode: str) -> None:
    env = upstream_env(tmp_path)
    counter = Counter(env["COUNTER_FILE"])
    call: dict[str, Any] = {"name": "record", "arguments": {"text": "same"}, "meta": key_meta("shared-key")}
    async with plain_http_upstream(env) as upstream:
        args = proxy_cli(["--upstream-url", upstream.url], f"sqlite:///{tmp_path}/proxy.db")
        async with serve_cli_http(args, env={**env, "MCP_DURABLE_TOKENS": TOKENS}) as proxy:
            async with client_as(proxy.url, "tokA", mode) as alice:
                alice_first = await alice.call_tool(**call)
                alice_again = await alice.call_tool(**call)
            async with client_as(proxy.url, "tokB", mode) as bob:
                bob_first = await bob.call_tool(**call)
                bob_calls = json.loads(resource_text(await bob.read_resource("journal://calls")))
                bob_record = json.loads(resource_text(await bob.read_resource("journal://calls/record/shared-key")))
                with pytest.raises(Exception):  # noqa: B017 - another principal's record reads as not found
                    await bob.read_resource("journal://calls/record/shared-key?principal=alice")
    assert counter.count("record") == 2  # once per principal, never a replay across them
    assert meta_of(alice_again)["mcp-durable/replayed"] is True
    assert wire(alice_again)["content"] == wire(alice_first)["content"]
    assert "mcp-durable/replayed" not in meta_of(bob_first)
    assert bob_first.structured_content["run"] != alice_first.structured_content["run"]
    # Each principal's scoped key went upstream, so a key-honouring upstream keeps them apart too.
    assert alice_first.structured_content["key"] == "alice:shared-key"
    assert bob_first.structured_content["key"] == "bob:shared-key"
    assert [c["principal"] for c in bob_calls["calls"]] == ["bob"]
    assert bob_record["principal"] == "bob" and "alice" not in json.dumps(bob_record)


async def test_an_upstream_behind_a_token_is_reached_only_with_it_and_a_stdio_upstream_sees_no_secret(
    tmp_path: Path,
) -> None:
    env = upstream_env(tmp_path)
    # The upstream: the plain server made durable by `serve --policies`, behind its own token.
    policies = tmp_path / "policies.toml"
    policies.write_text("[tools.plain]\ndurable = false\n")
    upstream_args = ["serve", PLAIN_UPSTREAM, "--policies", str(policies), "--journal", f"sqlite:///{tmp_path}/up.db"]
    async with serve_cli_http(upstream_args, env={**env, "MCP_DURABLE_TOKENS": "up-secret=proxy"}) as upstream:
        proxy_env = {**env, "MCP_DURABLE_TOKENS": TOKENS, "MCP_DURABLE_UPSTREAM_TOKEN": "up-secret"}
        args = proxy_cli(["--upstream-url", upstream.url], f"sqlite:///{tmp_path}/proxy.db")
        async with serve_cli_http(args, env=proxy_env) as proxy, client_as(proxy.url, "tokA", "legacy") as alice:
            ok = await alice.call_tool("plain", {"text": "x"})
        without = {**proxy_env, "MCP_DURABLE_UPSTREAM_TOKEN": ""}
        async with serve_cli_http(args, env=without) as proxy, client_as(proxy.url, "tokA", "legacy") as alice:
            refused = await alice.call_tool("plain", {"text": "x"}, meta=key_meta("k"))
    assert not ok.is_error and Counter(env["COUNTER_FILE"]).count("plain") == 1
    assert refused.is_error and meta_of(refused)["mcp-durable/error"]["error"] == "upstream_unavailable"
    assert "up-secret" not in json.dumps(wire(refused))
    # A stdio upstream's environment: server-everything's get-env shows what the child got.
    everything = ["--upstream-command", shlex.join(package_bin(EVERYTHING))]
    args = proxy_cli(everything, f"sqlite:///{tmp_path}/proxy2.db")
    async with serve_cli_http(args, env=proxy_env) as proxy, client_as(proxy.url, "tokA", "legacy") as alice:
        shown = json.dumps(wire(await alice.call_tool("get-env", {})))
    assert "PATH" in shown  # the child did get an environment
    assert "tokA" not in shown and "up-secret" not in shown and "MCP_DURABLE_TOKENS" not in shown


async def test_an_upstream_request_never_reaches_a_client_other_than_the_caller(tmp_path: Path) -> None:
    """Sampling from the upstream goes to the client of the call in flight; while calls of two
    clients are in flight it is refused rather than sent to either."""
    env = upstream_env(tmp_path)
    counter = Counter(env["COUNTER_FILE"])
    asked: dict[str, list[str]] = {"a": [], "b": []}

    def sampler(name: str):  # type: ignore[no-untyped-def]
        async def on_sampling(context: object, params: object) -> CreateMessageResult:
            asked[name].append(params.messages[0].content.text)  # type: ignore[attr-defined]
            return CreateMessageResult(
                role="assistant", content=TextContent(type="text", text=f"from {name}"), model="m"
            )

        return on_sampling

    proxy = ProxyServer(plain_stdio_spec(env), journal="memory://")
    async with (
        Client(proxy, mode="legacy", sampling_callback=sampler("a")) as a,
        Client(proxy, mode="legacy", sampling_callback=sampler("b")) as b,
    ):
        alone = await b.call_tool("ask_client", {"prompt": "alone?"})
        async with anyio.create_task_group() as tg:
            tg.start_soon(a.call_tool, "gated", {"text": "hold"})
            while counter.count("gated") == 0:
                await anyio.sleep(0.02)
            with pytest.raises(MCPError, match="cannot route sampling/createMessage"):
                await b.call_tool("ask_client", {"prompt": "crowded?"})  # the upstream's error, passed on
            counter.open_gate()
    assert wire(alone)["content"][0]["text"] == "from b"
    assert asked == {"a": [], "b": ["alone?"]}
