"""An upstream's `isError` result is not a final answer for a proxied tool unless its policy says so.

An upstream written on an SDK answers an exception (a transient crash) with an `isError` result,
which the proxy cannot tell from a deliberate one. Kept under the engine's default
(`tool_errors = "persist"`), it would answer every retry of the key with the crash for a day; the
proxy's default releases it, so a retry runs again. A policies file that says
`tool_errors = "persist"` (for the tool, or in `[defaults]`) keeps it.

The upstream is the plain Python upstream over stdio (a real subprocess); its `flaky` tool
(`idempotentHint: true`) raises on its first execution only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from mcp_durable.policy_file import load_policies
from mcp_durable.proxy import ProxyServer
from tests.helpers import first_text, key_meta, meta_of
from tests.proxy.upstreams import plain_stdio_spec, upstream_env
from tests.server.servers.counting import Counter

RELEASED = {
    "no policies file": None,
    "a file listing the tool without tool_errors": '[tools.flaky]\nin_doubt = "refuse"\n',
    "tool_errors = release": '[tools.flaky]\ntool_errors = "release"\n',
}
PERSISTED = {
    "tool_errors = persist": '[tools.flaky]\ntool_errors = "persist"\n',
    "persist in [defaults]": '[defaults]\ntool_errors = "persist"\n\n[tools.flaky]\nin_doubt = "retry"\n',
}


def _proxy(tmp_path: Path, policies: str | None) -> tuple[ProxyServer, Counter]:
    env = upstream_env(tmp_path)
    loaded = None
    if policies is not None:
        path = tmp_path / "policies.toml"
        path.write_text(policies)
        loaded = load_policies(path)
    proxy = ProxyServer(plain_stdio_spec(env), loaded, journal=f"sqlite:///{tmp_path}/proxy.db")
    return proxy, Counter(env["COUNTER_FILE"])


@pytest.mark.parametrize("policies", list(RELEASED.values()), ids=list(RELEASED))
async def test_an_upstream_error_result_is_released_so_a_retry_runs_again(tmp_path: Path, policies: str | None) -> None:
    proxy, counter = _proxy(tmp_path, policies)
    async with Client(proxy, mode="legacy") as client:
        crashed = await client.call_tool("flaky", {"text": "x"}, meta=key_meta("f-1"))
        retried = await client.call_tool("flaky", {"text": "x"}, meta=key_meta("f-1"))
        replayed = await client.call_tool("flaky", {"text": "x"}, meta=key_meta("f-1"))
    assert crashed.is_error and "Error executing tool flaky" in first_text(crashed)
    assert not retried.is_error, retried  # before the fix: the crash, replayed
    assert meta_of(retried).get("mcp-durable/replayed") is not True
    assert meta_of(replayed)["mcp-durable/replayed"] is True  # the success is final
    assert counter.count("flaky") == 2


@pytest.mark.parametrize("policies", list(PERSISTED.values()), ids=list(PERSISTED))
async def test_an_upstream_error_result_is_kept_where_the_policy_says_persist(tmp_path: Path, policies: str) -> None:
    proxy, counter = _proxy(tmp_path, policies)
    async with Client(proxy, mode="legacy") as client:
        crashed = await client.call_tool("flaky", {"text": "x"}, meta=key_meta("f-1"))
        repeated = await client.call_tool("flaky", {"text": "x"}, meta=key_meta("f-1"))
    assert crashed.is_error and repeated.is_error
    assert meta_of(repeated)["mcp-durable/replayed"] is True
    assert first_text(repeated) == first_text(crashed)
    assert counter.count("flaky") == 1
