"""What `mcp-durable serve --transport http` prints works as printed, and the server says what it is."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from importlib.metadata import version
from pathlib import Path

import anyio
from mcp import Client

from tests.docs.test_examples import inspector_or_skip
from tests.helpers import serve_http

PAYMENTS = "tools/payments.py"


def _banner_command(stderr: str) -> str:
    (line,) = [line for line in stderr.splitlines() if line.strip().startswith("e.g.:")]
    return line.split("e.g.:", 1)[1].strip()


async def test_the_inspector_command_of_the_serve_banner_is_pinned_and_works_as_printed(tmp_path: Path) -> None:
    env = {"PAYMENTS_LEDGER": str(tmp_path / "ledger.db")}
    async with serve_http(PAYMENTS, journal=f"sqlite:///{tmp_path}/journal.db", env=env) as served:
        with anyio.fail_after(30):
            while "e.g.:" not in served.stderr():
                await anyio.sleep(0.05)
        command = _banner_command(served.stderr())
        argv = shlex.split(command)
        assert argv[:3] == ["npx", "-y", "@modelcontextprotocol/inspector@2.12.0"], command  # pinned
        assert served.url in argv
        inspector_or_skip(argv[2])
        home = {"MCP_CATALOG_PATH": str(tmp_path / "catalog.json"), "MCP_CLIENT_CONFIG_PATH": str(tmp_path / "c.json")}
        proc = subprocess.run(
            argv, cwd=tmp_path, env={**os.environ, **home}, capture_output=True, text=True, timeout=300
        )
    assert proc.returncode == 0, f"{command}\n{proc.stdout}\n{proc.stderr}"
    tools = {tool["name"] for tool in json.loads(proc.stdout)["tools"]}
    assert {"refund", "charge"} <= tools


async def test_server_info_reports_the_package_version(tmp_path: Path) -> None:
    env = {"PAYMENTS_LEDGER": str(tmp_path / "ledger.db")}
    async with serve_http(PAYMENTS, journal=f"sqlite:///{tmp_path}/journal.db", env=env) as served:
        async with Client(served.url, mode="legacy") as client:
            info = client.server_info
    assert info is not None and info.name == "payments"
    assert info.version == version("mcp-durable") != ""
