"""`mcp-durable serve --journal URL` serves every part of the engine on URL, whatever journal the
target module built its server with: calls, lease renewals and the lifecycle all land on URL."""

from __future__ import annotations

from pathlib import Path

import anyio
from mcp import Client

from mcp_durable.journal import CallIdentity, CallState, create_journal
from tests.helpers import key_meta, serve_http

TARGET = "tests/server/servers/own_journal.py"


async def test_serve_journal_renews_leases_on_the_given_journal_not_the_modules_own(tmp_path: Path) -> None:
    given, own = f"sqlite:///{tmp_path}/given.db", f"sqlite:///{tmp_path}/own.db"
    gate = tmp_path / "gate"
    env = {"MODULE_JOURNAL": own, "GATE_FILE": str(gate)}
    identity = CallIdentity("local", "held", "k-1")
    async with serve_http(TARGET, journal=given, env=env) as served, Client(served.url) as client:
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: client.call_tool("held", {"text": "a"}, meta=key_meta("k-1")))
            journal = create_journal(given)
            await journal.open()
            try:
                leases: list[float] = []
                with anyio.fail_after(60):  # a lease that is never renewed fails here, never hangs
                    while len(set(leases)) < 3:  # the claim's lease, then two renewals of it
                        record = await journal.get(identity)
                        if record is not None and record.state == CallState.PENDING and record.lease_until:
                            if not leases or record.lease_until != leases[-1]:
                                leases.append(record.lease_until)
                        await anyio.sleep(0.02)
            finally:
                await journal.aclose()
            assert leases == sorted(leases)
            gate.touch()
    assert not (tmp_path / "own.db").exists(), "the module's own journal was used"
