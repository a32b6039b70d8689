"""A client of the proxy sees what it would see talking to the upstream directly, whatever it can
answer: the proxy holds one upstream session per set of client capabilities (sampling and its
parts, elicitation), declaring exactly that set, and sends each client's requests through the
session of the capabilities it declared.

server-everything lists `trigger-sampling-request` / `trigger-elicitation-request` only to a
client that declared sampling / elicitation: through the proxy a client declaring nothing is not
listed them, and one declaring them is, and is asked when it calls them. Each list is compared
with the one the same kind of client gets from server-everything directly (stdio). A 2026-07-28
client (that era has no server→client requests) is served by the no-capability session. The
plain Python upstream lists `ask_client` to everyone; a client without sampling calling it gets
the upstream's own answer, as directly. `mcp-durable proxy` serves streamable HTTP in a
subprocess.
"""

from __future__ import annotations

import shlex
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from mcp_types import CreateMessageResult, ElicitResult, TextContent

from mcp_durable.proxy import ProxyServer
from mcp_durable.proxy.router import NO_CAPABILITIES, Capabilities
from tests.helpers import REPO, first_text, key_meta, meta_of, serve_cli_http
from tests.node_peers import package_bin, require_node_peers
from tests.proxy.upstreams import EVERYTHING, PLAIN_UPSTREAM, plain_stdio_spec, proxy_cli, upstream_env
from tests.server.servers.counting import Counter

ERAS = ("legacy", "auto")
#: The capabilities a client declares: none, sampling, elicitation, or both (by its callbacks).
KINDS = ("none", "sampling", "elicitation", "both")
SAMPLING_TOOL = "trigger-sampling-request"
ELICITATION_TOOL = "trigger-elicitation-request"


def _proxy_args(tmp_path: Path, upstream: list[str]) -> list[str]:
    return proxy_cli(["--upstream-command", shlex.join(upstream)], f"file://{tmp_path}/journal")


async def _answer_sampling(context: Any, params: Any) -> CreateMessageResult:
    return CreateMessageResult(role="assistant", content=TextContent(type="text", text="four"), model="m")


async def _answer_elicitation(context: Any, params: Any) -> ElicitResult:
    return ElicitResult(action="accept", content={"name": "Ada"})


def _callbacks(kind: str) -> dict[str, Any]:
    callbacks: dict[str, Any] = {}
    if kind in ("sampling", "both"):
        callbacks["sampling_callback"] = _answer_sampling
    if kind in ("elicitation", "both"):
        callbacks["elicitation_callback"] = _answer_elicitation
    return callbacks


def _stdio(command: list[str], env: dict[str, str] | None = None) -> Any:
    return stdio_client(StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=str(REPO)))


async def _names(client: Client) -> list[str]:
    return sorted(tool.name for tool in (await client.list_tools()).tools)


async def _direct_names(command: list[str], kind: str, env: dict[str, str] | None = None) -> list[str]:
    async with Client(_stdio(command, env), mode="legacy", **_callbacks(kind)) as direct:
        return await _names(direct)


async def test_server_everything_lists_each_client_the_tools_it_lists_it_directly(tmp_path: Path) -> None:
    everything = package_bin(EVERYTHING)
    direct = {kind: await _direct_names(everything, kind) for kind in KINDS}
    async with serve_cli_http(_proxy_args(tmp_path, everything)) as served, AsyncExitStack() as clients:
        proxied = {}
        for kind in KINDS:  # all connected at once: each kind's session is its own
            client = await clients.enter_async_context(Client(served.url, mode="legacy", **_callbacks(kind)))
            proxied[kind] = await _names(client)
    for kind in KINDS:
        assert proxied[kind] == direct[kind], kind  # the same as directly
    assert SAMPLING_TOOL not in proxied["none"] and ELICITATION_TOOL not in proxied["none"]
    assert SAMPLING_TOOL in proxied["sampling"] and ELICITATION_TOOL not in proxied["sampling"]
    assert ELICITATION_TOOL in proxied["elicitation"] and SAMPLING_TOOL not in proxied["elicitation"]
    assert {SAMPLING_TOOL, ELICITATION_TOOL} <= set(proxied["both"])


async def test_a_2026_client_gets_the_listing_and_answers_of_a_client_that_declared_nothing(tmp_path: Path) -> None:
    everything = package_bin(EVERYTHING)
    async with Client(_stdio(everything), mode="legacy") as direct:
        listed = await _names(direct)
        called = await direct.call_tool(SAMPLING_TOOL, {"prompt": "2+2?"})
    async with serve_cli_http(_proxy_args(tmp_path, everything)) as served:
        # Callbacks given, but the 2026-07-28 era carries no server→client requests.
        async with Client(served.url, mode="auto", **_callbacks("both")) as modern:
            proxied = await _names(modern)
            answered = await modern.call_tool(SAMPLING_TOOL, {"prompt": "2+2?"})
    assert proxied == listed and SAMPLING_TOOL not in proxied
    assert called.is_error and answered.is_error
    assert first_text(answered) == first_text(called)  # the upstream's own answer: no such tool for it


@pytest.mark.parametrize("mode", ERAS)
async def test_server_everything_asks_a_client_that_declared_the_capabilities(tmp_path: Path, mode: str) -> None:
    require_node_peers()
    async with serve_cli_http(_proxy_args(tmp_path, package_bin(EVERYTHING))) as served:
        async with Client(served.url, mode=mode) as plain:
            listed = await _names(plain)
        async with Client(served.url, mode="legacy", **_callbacks("both")) as able:
            elicited = await able.call_tool(ELICITATION_TOOL, {})
            sampled = await able.call_tool(SAMPLING_TOOL, {"prompt": "2+2?"})
    assert SAMPLING_TOOL not in listed and ELICITATION_TOOL not in listed
    assert not elicited.is_error and "Ada" in str(elicited.content)
    assert not sampled.is_error and "four" in first_text(sampled)


@pytest.mark.parametrize("mode", ERAS)
async def test_a_python_upstream_answers_a_client_without_sampling_as_it_would_directly(
    tmp_path: Path, mode: str
) -> None:
    env = upstream_env(tmp_path)
    plain_upstream = [sys.executable, str(REPO / PLAIN_UPSTREAM)]
    async with Client(_stdio(plain_upstream, env), mode="legacy") as direct:
        listed = await _names(direct)
        with pytest.raises(MCPError) as directly:
            await direct.call_tool("ask_client", {"prompt": "2+2?"})
    async with serve_cli_http(_proxy_args(tmp_path, plain_upstream), env=env) as served:
        # A 2026-07-28 client is served as one that declared nothing (that era cannot be asked).
        async with Client(
            served.url, mode=mode, sampling_callback=_answer_sampling if mode == "auto" else None
        ) as plain:
            proxied = await _names(plain)
            with pytest.raises(MCPError) as refused:
                await plain.call_tool("ask_client", {"prompt": "2+2?"})
        async with Client(served.url, mode="legacy", sampling_callback=_answer_sampling) as sampling:
            answered = await sampling.call_tool("ask_client", {"prompt": "2+2?"})
    assert set(listed) <= set(proxied)  # (the proxy adds its own tools only)
    # The upstream's own answer to a client that declared no sampling, not a refusal of the proxy's.
    assert refused.value.error == directly.value.error
    assert first_text(answered) == "four"


async def test_one_session_per_capability_set_shared_and_closed_and_a_key_runs_once_across_them(
    tmp_path: Path,
) -> None:
    env = upstream_env(tmp_path)
    proxy = ProxyServer(plain_stdio_spec(env), journal=f"sqlite:///{tmp_path}/proxy.db")
    async with (
        Client(proxy, mode="legacy") as first,
        Client(proxy, mode="legacy") as second,
        Client(proxy, mode="legacy", sampling_callback=_answer_sampling) as able,
    ):
        ran = await first.call_tool("record", {"text": "x"}, meta=key_meta("k-1"))
        # The same key through the other session: the journal answers it, the upstream is not asked.
        repeated = await able.call_tool("record", {"text": "x"}, meta=key_meta("k-1"))
        passed = await second.call_tool("plain", {"text": "y"})
        asked = await able.call_tool("ask_client", {"prompt": "2+2?"})
        sessions = {session.capabilities: session for session in proxy.upstream.sessions()}
        connects = {capabilities: session.connects for capabilities, session in sessions.items()}
    assert connects == {NO_CAPABILITIES: 1, Capabilities(sampling=True): 1}  # the two plain clients share one
    assert not any(session.connected for session in sessions.values())  # all closed with the proxy
    assert Counter(env["COUNTER_FILE"]).count("record") == 1
    assert meta_of(repeated)["mcp-durable/replayed"] is True and repeated.structured_content == ran.structured_content
    assert not passed.is_error and first_text(asked) == "four"


async def test_a_request_of_the_upstream_reaches_its_client_while_a_client_of_another_set_has_a_call_in_flight(
    tmp_path: Path,
) -> None:
    """Each session routes its own requests: another client's call in flight on another session
    does not make the upstream's sampling request unroutable (it did with one shared session)."""
    env = upstream_env(tmp_path)
    counter = Counter(env["COUNTER_FILE"])
    proxy = ProxyServer(plain_stdio_spec(env), journal=f"sqlite:///{tmp_path}/proxy.db")
    stalled: list[Any] = []
    async with (
        Client(proxy, mode="legacy") as plain,
        Client(proxy, mode="legacy", sampling_callback=_answer_sampling) as able,
        anyio.create_task_group() as tg,
    ):

        async def stall() -> None:
            stalled.append(await plain.call_tool("stall", {"text": "hold"}))

        tg.start_soon(stall)
        try:
            with anyio.fail_after(30):  # (a bound on a hang, not a timing)
                while counter.count("stall") != 1:
                    await anyio.sleep(0.02)
            asked = await able.call_tool("ask_client", {"prompt": "2+2?"})  # while `stall` is in flight
        finally:
            counter.open_gate()
    assert first_text(asked) == "four"
    [held] = stalled
    assert not held.is_error
