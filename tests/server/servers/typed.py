"""A test target: durable tools whose output schemas differ, for refusals seen by validating clients.

`as_str`, `as_int`, `as_model` and `as_dict` return a `str`, an `int`, a pydantic model and a
`dict[str, Any]`, so the SDK gives them the output schemas `{"result": string}` (required),
`{"result": integer}` (required), the model's (field `text` required) and an open object. Each
requires a caller key, refuses calls in doubt, waits only 50 ms for a duplicate in flight, and
takes arguments of at most `$MAX_ARGUMENT_BYTES` (default 1 KiB), so every refusal code can be
provoked on every one of them:

- `missing_key` (no key), `invalid_key` (a bad key), `key_reuse` (a key reused with other text),
- `too_large` (text over the argument limit),
- `in_progress` (`hold=true` keeps a call running until the file `$GATE_FILE.<tool>` exists; it
  creates `$GATE_FILE.<tool>.started` once it runs; a duplicate then gets `in_progress`),
- `in_doubt` (seed the journal with `seed_in_doubt` before serving: key `k-doubt`, text `doubt`),
- `journal_unavailable` (serve a second server on the same file journal: the lock is taken).

Serve it with `mcp-durable serve tests/server/servers/typed.py:make_server`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel

from mcp_durable import DurableServer, ToolPolicy
from mcp_durable.journal import CallIdentity, CallRecord, CallState, create_journal
from mcp_durable.keys import canonical_json, fingerprint

TOOLS = ("as_str", "as_int", "as_model", "as_dict")
DOUBT_KEY, DOUBT_TEXT = "k-doubt", "doubt"
POLICY = ToolPolicy(key="required", in_doubt="refuse", wait=0.05)


class Echo(BaseModel):
    text: str
    length: int


def make_server(journal: str | None = None) -> DurableServer:
    limit = int(os.environ.get("MAX_ARGUMENT_BYTES", "1024"))
    server = DurableServer("typed", journal=journal, max_argument_bytes=limit)

    async def held(tool: str, hold: bool) -> None:
        if not hold:
            return
        gate = Path(f"{os.environ['GATE_FILE']}.{tool}")
        Path(f"{gate}.started").touch()
        while not gate.exists():  # released by the test: no timing involved
            await anyio.sleep(0.01)

    @server.tool(durable=POLICY)
    async def as_str(text: str, hold: bool = False) -> str:
        await held("as_str", hold)
        return text

    @server.tool(durable=POLICY)
    async def as_int(text: str, hold: bool = False) -> int:
        await held("as_int", hold)
        return len(text)

    @server.tool(durable=POLICY)
    async def as_model(text: str, hold: bool = False) -> Echo:
        await held("as_model", hold)
        return Echo(text=text, length=len(text))

    @server.tool(durable=POLICY)
    async def as_dict(text: str, hold: bool = False) -> dict[str, Any]:
        await held("as_dict", hold)
        return {"text": text}

    return server


async def seed_in_doubt(url: str) -> None:
    """Leave every tool a call with key `k-doubt` (text `doubt`) that a dead previous boot owned."""
    journal = create_journal(url)
    await journal.open()
    try:
        arguments = {"hold": False, "text": DOUBT_TEXT}  # the validated arguments, defaults filled
        for tool in TOOLS:
            record = CallRecord(
                identity=CallIdentity("local", tool, DOUBT_KEY),
                fingerprint=fingerprint(arguments),
                state=CallState.PENDING,
                version=1,
                run_id=f"run-{tool}",
                attempts=1,
                created_at=1.0,
                updated_at=1.0,
                owner="previous-boot",
                lease_until=2.0,
                arguments=canonical_json(arguments),
            )
            won, _ = await journal.claim(record, 1.0)
            assert won
    finally:
        await journal.aclose()
