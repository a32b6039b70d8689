"""Upstreams for the proxy tests: npm reference servers and the plain Python upstream.

upstream_env(tmp_path)            env for tests/proxy/servers/plain_upstream.py (counter, ledger)
async with plain_http_upstream(env) as served: …   # the plain server over HTTP (uvicorn subprocess)
plain_stdio_command()             the plain server as a stdio command
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from mcp_durable.proxy.upstream import UpstreamSpec
from tests.helpers import REPO, ServedHttp, serve_cli_http

PLAIN_UPSTREAM = "tests/proxy/servers/plain_upstream.py"
MEMORY = "@modelcontextprotocol/server-memory"
EVERYTHING = "@modelcontextprotocol/server-everything"


def upstream_env(tmp_path: Path) -> dict[str, str]:
    """The environment of the plain upstream: counter file, ledger, and the repo importable."""
    return {
        **os.environ,
        "COUNTER_FILE": str(tmp_path / "counter"),
        "LEDGER_DB": str(tmp_path / "ledger.db"),
        "PYTHONPATH": str(REPO),
    }


@asynccontextmanager
async def plain_http_upstream(env: Mapping[str, str], extra: tuple[str, ...] = ()) -> AsyncIterator[ServedHttp]:
    """The plain upstream served over streamable HTTP by `mcp-durable serve` (uvicorn; no journal)."""
    async with serve_cli_http(["serve", PLAIN_UPSTREAM, *extra], env=env) as served:
        yield served


def plain_stdio_spec(env: Mapping[str, str]) -> UpstreamSpec:
    """The plain upstream as a stdio command (a Python process the proxy starts and restarts)."""
    return UpstreamSpec(command=[sys.executable, str(REPO / PLAIN_UPSTREAM)], env=dict(env), cwd=str(REPO))


def npm_spec(package: str, env: Mapping[str, str] | None = None, args: tuple[str, ...] = ()) -> UpstreamSpec:
    from tests.node_peers import package_bin

    return UpstreamSpec(command=[*package_bin(package), *args], env={**os.environ, **(env or {})})


def proxy_cli(spec_args: list[str], journal: str, *extra: str) -> list[str]:
    """`mcp-durable proxy` arguments (without the transport options serve_cli_http adds)."""
    return ["proxy", *spec_args, "--journal", journal, *extra]
