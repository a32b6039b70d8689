"""The MCP conformance suite 0.1.16's server scenarios pass through `mcp-durable proxy` as they
pass against the server it fronts.

The server: tests/proxy/servers/conformance_fixtures.py, a plain `MCPServer` with the suite's
fixtures. Directly, it is served over streamable HTTP in this process; behind the proxy, it is the
upstream (stdio) of a real `mcp-durable proxy --transport http` subprocess on a file journal.
The suite runs all its server scenarios (`--suite all`: 32, pending ones included, 44 checks);
every check passes directly, and each scenario ends the same way through the proxy (`WARNING`s
included: the SSE-polling scenario warns about both servers' missing priming event and `retry`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.conformance.suites import SERVER_SUITE, counted, failed, outcomes, run_conformance
from tests.helpers import serve_app, serve_cli_http
from tests.node_peers import require_node_peers
from tests.proxy.servers.conformance_fixtures import server as fixtures

FIXTURES = "tests/proxy/servers/conformance_fixtures.py"
#: The suite's server scenarios and checks, all of them (`conformance list --server`).
SCENARIOS = 32
CHECKS = 44


async def test_every_server_scenario_passes_through_the_proxy_as_directly(tmp_path: Path) -> None:
    require_node_peers()
    async with serve_app(fixtures.streamable_http_app()) as base:
        direct = await run_conformance(SERVER_SUITE, f"{base}/mcp", tmp_path / "direct", "--suite", "all")
    assert len(direct) == SCENARIOS, sorted(direct)
    assert failed(direct) == {}
    assert counted(direct) == (CHECKS, 0)

    proxy = ["proxy", "--upstream-command", f"{sys.executable} {FIXTURES}", "--journal", f"file://{tmp_path / 'j'}"]
    async with serve_cli_http(proxy) as served:
        proxied = await run_conformance(SERVER_SUITE, served.url, tmp_path / "proxied", "--suite", "all")
    assert failed(proxied) == {}, served.stderr()
    assert counted(proxied) == (CHECKS, 0)
    assert outcomes(proxied) == outcomes(direct)
