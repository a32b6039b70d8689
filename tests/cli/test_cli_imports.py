"""The operator CLI does not load the MCP face: `mcp-durable journal stats` (and the other
journal commands that only read) import no module of `mcp_durable.server` or
`mcp_durable.console`, none of `mcp_durable.proxy` but its argument parser (`proxy/cli.py`, which
`build_parser` needs for `mcp-durable proxy`), and not the MCP SDK (`mcp`). Checked in a fresh
interpreter, on a real file journal, after the command's code path ran (`cli.main`, as the
console script calls it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import orjson
import pytest

from mcp_durable.journal import CallIdentity, CallRecord, CallState, create_journal
from tests.helpers import REPO

PROBE = """
import sys, json
import mcp_durable.cli.commands as cli
rc = cli.main(sys.argv[1:])
face = ("mcp_durable.server", "mcp_durable.console", "mcp_durable.proxy.", "mcp.", "mcp_types")
parser_only = ("mcp_durable.cli.proxy",)
loaded = sorted(m for m in sys.modules
                if m == "mcp" or (m.startswith(face) and m not in parser_only))
print(json.dumps({"rc": rc, "loaded": loaded}), file=sys.stderr)
"""


async def _journal_with_a_record(url: str) -> None:
    journal = create_journal(url)
    await journal.open()
    try:
        now = time.time()
        record = CallRecord(
            identity=CallIdentity("local", "refund", "O-1"),
            fingerprint="f",
            state=CallState.COMPLETED,
            version=1,
            run_id="r",
            attempts=1,
            created_at=now,
            updated_at=now,
            completed_at=now,
            result=b'{"content": []}',
            arguments=b'{"order_id": "O-1"}',
        )
        await journal.claim(record, now)
        await journal.append("worker-1", "checkpoint", {"step": 1}, now)
    finally:
        await journal.aclose()


@pytest.mark.parametrize("command", [["stats"], ["list"], ["show", "refund", "O-1"], ["tail"]])
def test_journal_commands_load_no_server_module(tmp_path: Path, command: list[str]) -> None:
    url = f"file://{tmp_path / 'journal'}"
    anyio.run(_journal_with_a_record, url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_DURABLE_")}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, "journal", *command, "--journal", url, "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    report = orjson.loads(proc.stderr.strip().splitlines()[-1])
    assert report["rc"] == 0, proc.stderr
    assert proc.stdout.strip(), "the command printed nothing"
    assert report["loaded"] == [], f"journal {command[0]} loaded the MCP face: {report['loaded']}"
