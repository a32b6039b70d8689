"""An upstream tool that asks its client (sampling, elicitation), called through the proxy by a
client that cannot answer: the proxy refuses the upstream's request, saying why, and the client
gets the upstream's answer carrying that reason; a client that can answer is asked.

The proxy declares sampling and elicitation to its upstream for all its clients (one shared
session), so the upstream lists such tools to every client and asks whichever calls them. The
upstream's tools say nothing of the capabilities they need, so the proxy lists them all; what
it can do is never send a client a request it did not declare it can answer, nor one its era
cannot carry (2026-07-28 has no server→client requests). `mcp-durable proxy` serves streamable
HTTP in a subprocess; the upstreams are the plain Python server and server-everything from npm.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import CreateMessageResult, ElicitResult, TextContent

from tests.helpers import first_text, serve_cli_http
from tests.node_peers import package_bin, require_node_peers
from tests.proxy.upstreams import EVERYTHING, PLAIN_UPSTREAM, proxy_cli, upstream_env

ERAS = ("legacy", "auto")
#: Why the proxy refused, by the calling client's era, for a client that declared nothing.
WHY = {
    "legacy": "it did not declare the {capability} capability",
    "auto": "it speaks protocol 2026-07-28, which has no requests from a server to its client",
}


def _refused(method: str, capability: str, mode: str) -> str:
    return f"mcp-durable proxy cannot send {method} to the calling client: " + WHY[mode].format(capability=capability)


def _proxy_args(tmp_path: Path, upstream: list[str]) -> list[str]:
    return proxy_cli(["--upstream-command", shlex.join(upstream)], f"file://{tmp_path}/journal")


async def _answer_sampling(context: Any, params: Any) -> CreateMessageResult:
    return CreateMessageResult(role="assistant", content=TextContent(type="text", text="four"), model="m")


async def _answer_elicitation(context: Any, params: Any) -> ElicitResult:
    return ElicitResult(action="accept", content={"name": "Ada"})


@pytest.mark.parametrize("mode", ERAS)
async def test_a_python_upstream_asking_a_client_without_sampling_gets_the_reason(tmp_path: Path, mode: str) -> None:
    args = _proxy_args(tmp_path, [sys.executable, PLAIN_UPSTREAM])
    async with serve_cli_http(args, env=upstream_env(tmp_path)) as served:
        async with Client(served.url, mode=mode) as plain:
            # The SDK upstream answers the refused request's error as a JSON-RPC error of the call.
            with pytest.raises(MCPError) as refused:
                await plain.call_tool("ask_client", {"prompt": "2+2?"})
        assert _refused("sampling/createMessage", "sampling", mode) in refused.value.error.message
        async with Client(served.url, mode="legacy", sampling_callback=_answer_sampling) as sampling:
            answered = await sampling.call_tool("ask_client", {"prompt": "2+2?"})
        assert first_text(answered) == "four"


@pytest.mark.parametrize("mode", ERAS)
async def test_server_everything_asking_a_client_that_cannot_answer_gets_the_reason(tmp_path: Path, mode: str) -> None:
    require_node_peers()
    async with serve_cli_http(_proxy_args(tmp_path, package_bin(EVERYTHING))) as served:
        async with Client(served.url, mode=mode) as plain:
            elicited = await plain.call_tool("trigger-elicitation-request", {})
            sampled = await plain.call_tool("trigger-sampling-request", {"prompt": "2+2?"})
        # server-everything answers the refused request's error as an error result of the call.
        assert elicited.is_error and _refused("elicitation/create", "elicitation", mode) in first_text(elicited)
        assert sampled.is_error and _refused("sampling/createMessage", "sampling", mode) in first_text(sampled)
        async with Client(
            served.url, mode="legacy", sampling_callback=_answer_sampling, elicitation_callback=_answer_elicitation
        ) as able:
            elicited = await able.call_tool("trigger-elicitation-request", {})
            sampled = await able.call_tool("trigger-sampling-request", {"prompt": "2+2?"})
        assert not elicited.is_error and "Ada" in str(elicited.content)
        assert not sampled.is_error and "four" in first_text(sampled)
