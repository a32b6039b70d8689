"""The command line reads the environment as docs/cli.md says, though the library does not.

`mcp-durable` turns the process default of `trust_env` on before it loads a target, so a served
module's `DurableServer(...)`, built with no journal and no tokens, takes them from
`MCP_DURABLE_JOURNAL` and `MCP_DURABLE_TOKENS` (real subprocesses, the console script);
`main` called in a process of its own restores the library's default when it returns.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx2
import orjson

from mcp_durable import config
from mcp_durable.cli.commands import main
from tests.helpers import REPO, client_as, key_meta, serve_cli_http, serve_command, serve_http

COUNTING = "tests/server/servers/counting.py:make_server"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}},
}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def test_serve_over_http_with_mcp_durable_tokens_set_requires_the_token(tmp_path: Path) -> None:
    env = {"COUNTER_FILE": str(tmp_path / "counter"), config.TOKENS: "tok-alice=alice"}
    async with serve_http(COUNTING, journal=f"file://{tmp_path}/journal", env=env) as served:
        async with httpx2.AsyncClient(timeout=30.0) as http:
            refused = await http.post(served.url, json=INITIALIZE, headers=HEADERS)
        async with client_as(served.url, "tok-alice", "auto") as alice:
            answer = await alice.call_tool("whoami", {"text": "x"}, meta=key_meta("k-1"))
    assert refused.status_code == 401
    assert answer.structured_content is not None and answer.structured_content["principal"] == "alice"


async def test_serve_without_journal_serves_the_module_on_mcp_durable_journal(tmp_path: Path) -> None:
    journal = f"sqlite:///{tmp_path}/from-environment.db"
    env = {"COUNTER_FILE": str(tmp_path / "counter"), config.JOURNAL: journal}
    async with serve_cli_http(["serve", COUNTING], env=env) as served:  # the module's DurableServer(journal=None)
        async with client_as(served.url, "unused", "auto") as client:
            answer = await client.call_tool("record", {"text": "x"}, meta=key_meta("k-1"))
        banner = served.stderr()
    assert not answer.is_error
    assert f"journal: {journal}" in banner
    # `journal` commands read it too: the call is in that journal.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MCP_DURABLE_")}
    stats = subprocess.run(
        [*serve_command(), "journal", "--json", "stats"],
        capture_output=True,
        text=True,
        env={**clean, config.JOURNAL: journal},
        cwd=REPO,
        timeout=120,
        check=True,
    )
    assert orjson.loads(stats.stdout)["calls"] == 1, stats.stdout


def test_main_restores_the_librarys_default_when_it_returns(tmp_path: Path) -> None:
    assert config.trusts_environment() is False
    assert main(["journal", "--journal", f"sqlite:///{tmp_path}/j.db", "stats"]) == 0
    assert config.trusts_environment() is False
