"""Subscriptions to the upstream's resources, and its list changes, through the proxy.

`mcp-durable proxy` serves streamable HTTP in a subprocess in front of a stdio upstream:
tests/proxy/servers/subscribable_upstream.py (a low-level server declaring `resources.subscribe`
and `tools.listChanged`, whose `touch(uri)` announces an update of `uri` when it is subscribed to,
and whose `subscriptions()` says what it is subscribed to), the plain upstream (no subscriptions),
or server-everything from npm. Two real clients in each era: 2025-11-25 subscribes with
`resources/subscribe`, 2026-07-28 with a `subscriptions/listen` stream.

Every "did not receive" is read after a later update the same client did receive: the proxy relays
the upstream's notifications in order, one client connection's (or listen stream's) are delivered
in order, so an update wrongly sent to it would have arrived before the later one.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated, ToolsListChanged
from mcp_types import INVALID_PARAMS, ResourceUpdatedNotification

from tests.helpers import key_meta, meta_of, serve_cli_http
from tests.node_peers import package_bin, require_node_peers
from tests.proxy.upstreams import EVERYTHING, PLAIN_UPSTREAM, proxy_cli, upstream_env

# resources/subscribe is the 2025-11-25 mechanism under test, deprecated only for the new era.
pytestmark = pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")

ERAS = ("legacy", "auto")
WAIT = 30.0  # a bound on a hang, not a timed assertion
SUBSCRIBABLE = "tests/proxy/servers/subscribable_upstream.py"
NOTE_A, NOTE_B = "note://a", "note://b"


class Heard:
    """What one client heard, in order: resource updates (both eras) and tools list changes (2026)."""

    def __init__(self) -> None:
        self.uris: list[str] = []
        self.tools_changed = 0

    async def on_message(self, message: Any) -> None:
        """A 2025-11-25 client's message handler."""
        if isinstance(message, ResourceUpdatedNotification):
            self.uris.append(message.params.uri)

    async def until(self, uri: str, count: int = 1) -> None:
        with anyio.fail_after(WAIT):
            while self.uris.count(uri) < count:
                await anyio.sleep(0.01)


@asynccontextmanager
async def proxy(tmp_path: Path, upstream: list[str]) -> AsyncIterator[str]:
    """The proxy over HTTP in front of the stdio command `upstream`; yields its URL."""
    args = proxy_cli(["--upstream-command", shlex.join(upstream)], f"file://{tmp_path}/journal")
    async with serve_cli_http(args, env=upstream_env(tmp_path)) as served:
        yield served.url


def python_upstream(path: str) -> list[str]:
    return [sys.executable, path]


@asynccontextmanager
async def client(url: str, mode: str, heard: Heard) -> AsyncIterator[Client]:
    handler = heard.on_message if mode == "legacy" else None  # 2026-07-28: the listen stream's events
    async with Client(url, mode=mode, message_handler=handler) as connected:
        yield connected


@asynccontextmanager
async def holding(connected: Client, mode: str, uris: list[str], heard: Heard) -> AsyncIterator[None]:
    """`connected` subscribed to `uris` for the block: `resources/subscribe` (and unsubscribe at
    the end) in 2025-11-25, a listen stream in 2026-07-28 (which also asks for tools changes)."""
    if mode == "legacy":
        for uri in uris:
            await connected.session.subscribe_resource(uri)
        yield
        for uri in uris:
            await connected.session.unsubscribe_resource(uri)
        return
    async with (
        connected.listen(resource_subscriptions=uris, tools_list_changed=True) as stream,
        anyio.create_task_group() as group,
    ):
        assert sorted(stream.honored.resource_subscriptions or []) == sorted(uris)

        async def collect() -> None:
            async for event in stream:
                if isinstance(event, ResourceUpdated):
                    heard.uris.append(event.uri)
                elif isinstance(event, ToolsListChanged):
                    heard.tools_changed += 1

        group.start_soon(collect)
        yield
        group.cancel_scope.cancel()


async def structured(connected: Client, tool: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    result = await connected.call_tool(tool, arguments or {})
    assert not result.is_error, result
    content: dict[str, Any] | None = result.structured_content
    assert content is not None
    return content


async def upstream_subscriptions(connected: Client) -> list[str]:
    return list((await structured(connected, "subscriptions"))["uris"])


@pytest.mark.parametrize("mode", ERAS)
async def test_an_upstream_update_reaches_the_clients_subscribed_to_it_and_no_other(tmp_path: Path, mode: str) -> None:
    heard_a, heard_b = Heard(), Heard()
    async with (
        proxy(tmp_path, python_upstream(SUBSCRIBABLE)) as url,
        client(url, mode, heard_a) as a,
        client(url, mode, heard_b) as b,
        holding(a, mode, [NOTE_A], heard_a),
        holding(b, mode, [NOTE_B], heard_b),
    ):
        assert await upstream_subscriptions(a) == [NOTE_A, NOTE_B]  # the proxy subscribed the upstream
        assert (await structured(b, "touch", {"uri": NOTE_A}))["sent"] is True
        assert (await structured(a, "touch", {"uri": NOTE_B}))["sent"] is True
        await heard_a.until(NOTE_A)
        await heard_b.until(NOTE_B)
        assert heard_b.uris == [NOTE_B]  # a's update came first: it did not reach b
        await structured(b, "touch", {"uri": NOTE_A})
        await heard_a.until(NOTE_A, 2)
        assert heard_a.uris == [NOTE_A, NOTE_A]  # b's update, between a's two, did not reach a


@pytest.mark.parametrize("mode", ERAS)
async def test_the_upstream_is_subscribed_once_while_any_client_holds_the_resource(tmp_path: Path, mode: str) -> None:
    heard_a, heard_b = Heard(), Heard()
    async with (
        proxy(tmp_path, python_upstream(SUBSCRIBABLE)) as url,
        client(url, mode, heard_a) as a,
        client(url, mode, heard_b) as b,
    ):
        async with holding(b, mode, [NOTE_A], heard_b):
            async with holding(a, mode, [NOTE_A], heard_a):
                assert await upstream_subscriptions(a) == [NOTE_A]
                await structured(a, "touch", {"uri": NOTE_A})
                await heard_a.until(NOTE_A)
                await heard_b.until(NOTE_A)
            # a let go; b still holds it, so the upstream stays subscribed and b alone hears it.
            assert await upstream_subscriptions(a) == [NOTE_A]
            await structured(a, "touch", {"uri": NOTE_A})
            await heard_b.until(NOTE_A, 2)
            async with holding(a, mode, [NOTE_B], heard_a):
                await structured(a, "touch", {"uri": NOTE_B})
                await heard_a.until(NOTE_B)
            assert heard_a.uris == [NOTE_A, NOTE_B]
        # The last holder let go: the upstream is unsubscribed (a listen stream's end reaches the
        # proxy as its cancellation, after the client has left it).
        with anyio.fail_after(WAIT):
            while await upstream_subscriptions(a) != []:
                await anyio.sleep(0.05)


async def _pid_or_none(connected: Client) -> int | None:
    """The upstream's pid; None for a call sent into the killed child before the proxy saw it die."""
    try:
        return int((await structured(connected, "pid"))["pid"])
    except MCPError:
        return None


async def test_subscriptions_are_made_again_on_a_restarted_upstream(tmp_path: Path) -> None:
    heard = Heard()
    async with (
        proxy(tmp_path, python_upstream(SUBSCRIBABLE)) as url,
        client(url, "legacy", heard) as a,
        holding(a, "legacy", [NOTE_A], heard),
    ):
        first = (await structured(a, "pid"))["pid"]
        os.kill(first, signal.SIGKILL)
        with anyio.fail_after(WAIT):
            while await _pid_or_none(a) in (None, first):
                await anyio.sleep(0.05)
        assert await upstream_subscriptions(a) == [NOTE_A]  # the new child was subscribed again
        assert (await structured(a, "touch", {"uri": NOTE_A}))["sent"] is True
        await heard.until(NOTE_A)


async def test_a_2025_subscription_to_an_upstream_without_subscriptions_is_refused(tmp_path: Path) -> None:
    heard = Heard()
    async with proxy(tmp_path, python_upstream(PLAIN_UPSTREAM)) as url, client(url, "legacy", heard) as connected:
        with pytest.raises(MCPError, match="does not serve resource subscriptions") as refused:
            await connected.session.subscribe_resource("plain://greeting")
        assert refused.value.error.code == INVALID_PARAMS
        await connected.session.subscribe_resource("journal://stats")  # the proxy's own still can be


async def test_a_2026_listen_stream_is_not_acknowledged_an_upstream_without_subscriptions(tmp_path: Path) -> None:
    async with (
        proxy(tmp_path, python_upstream(PLAIN_UPSTREAM)) as url,
        Client(url) as connected,
        connected.listen(resource_subscriptions=["plain://greeting", "journal://stats"]) as stream,
    ):
        assert stream.honored.resource_subscriptions == ["journal://stats"]


@pytest.mark.parametrize("mode", ERAS)
async def test_a_changed_upstream_tool_list_is_listed_and_its_policies_applied(tmp_path: Path, mode: str) -> None:
    heard_a, heard_b = Heard(), Heard()
    async with (
        proxy(tmp_path, python_upstream(SUBSCRIBABLE)) as url,
        client(url, mode, heard_a) as a,
        client(url, mode, heard_b) as b,
        holding(a, mode, [NOTE_A], heard_a),
    ):
        assert "extra" not in {tool.name for tool in (await b.list_tools()).tools}
        await structured(b, "grow")
        if mode == "auto":  # told, after the proxy listed the tools again
            with anyio.fail_after(WAIT):
                while heard_a.tools_changed == 0:
                    await anyio.sleep(0.01)
        tools = {tool.name: tool for tool in (await a.list_tools()).tools}
        assert "extra" in tools
        annotations = tools["extra"].annotations
        assert annotations is not None and annotations.idempotent_hint is True
        first = await a.call_tool("extra", {}, meta=key_meta("x-1"))
        second = await a.call_tool("extra", {}, meta=key_meta("x-1"))
        assert meta_of(second)["mcp-durable/replayed"] is True  # durable by its annotation
        assert second.structured_content == first.structured_content


@pytest.mark.parametrize("mode", ERAS)
async def test_server_everything_updates_reach_the_subscribed_client_only(tmp_path: Path, mode: str) -> None:
    require_node_peers()
    heard_a, heard_b = Heard(), Heard()
    async with proxy(tmp_path, package_bin(EVERYTHING)) as url, client(url, mode, heard_a) as a:
        resources = [r.uri for r in (await a.list_resources()).resources if not r.uri.startswith("journal://")]
        first, second = resources[:2]
        async with (
            client(url, mode, heard_b) as b,
            holding(a, mode, [first], heard_a),
            holding(b, mode, [second], heard_b),
        ):
            # It announces each subscribed resource at once (in the order subscribed), then every 5 s.
            started = await a.call_tool("toggle-subscriber-updates", {})
            assert not started.is_error, started
            await heard_a.until(first)
            await heard_b.until(second)
            assert first not in heard_b.uris  # announced before b's own: it did not reach b
            await a.call_tool("toggle-subscriber-updates", {})  # stopped


async def test_a_client_gone_without_unsubscribing_lets_go_of_the_upstream_subscription(tmp_path: Path) -> None:
    heard_a, heard_b = Heard(), Heard()
    async with proxy(tmp_path, python_upstream(SUBSCRIBABLE)) as url, client(url, "legacy", heard_b) as b:
        async with client(url, "legacy", heard_a) as a:
            await a.session.subscribe_resource(NOTE_A)
            assert await upstream_subscriptions(b) == [NOTE_A]
        # a closed its connection without unsubscribing; its teardown reaches the proxy after that.
        with anyio.fail_after(WAIT):
            while await upstream_subscriptions(b) != []:
                await anyio.sleep(0.05)
