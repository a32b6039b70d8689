"""Background recovery: a reconcile-policy call left in doubt by a SIGKILL is decided by the restarted
server itself, with no call for its key.

A real `mcp-durable serve` process sending mail through an outbox that does not deduplicate is
killed inside the danger window (the mail went out, its result was not journaled) or before the
effect. The restarted server reconciles in the background (`reconcile_interval` of 1 s): found →
the record completes with the mail the outbox holds; not applied → it is released, so the next
call sends it. The test only watches the journal meanwhile; it calls nothing with that key.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from mcp_durable import CallIdentity, CallState, create_journal
from mcp_durable.journal.model import CallRecord
from tests.crash.crash_servers.harness import StdioServer, journal_url
from tests.crash.test_danger_window import TARGET, Run

MAIL = {"to": "ops@example.com", "subject": "refund", "body": "O-1 refunded"}
# The lease outlives the restart on a shared journal, so the first pass at start cannot decide yet
# (the owner might be alive) and a later pass, one interval on, does.
SETTINGS = {"CRASH_RECONCILE_EVERY": "1", "CRASH_LEASE": "2"}


async def watch(url: str, key: str) -> CallRecord:
    """Re-read the record (read-only, as the CLI would) until the background has decided it."""
    read_only = url + ("&" if "?" in url else "?") + "mode=ro"
    with anyio.fail_after(60):
        while True:
            journal = create_journal(read_only)
            await journal.open()
            try:
                record = await journal.get(CallIdentity("local", "send_email", key))
            finally:
                await journal.aclose()
            if record is not None and record.state in (CallState.COMPLETED, CallState.RELEASED):
                return record
            await anyio.sleep(0.1)


@pytest.mark.parametrize("journal", ["sqlite", "file"])
@pytest.mark.parametrize("point", ["danger_window", "before_effect"])
async def test_a_call_in_doubt_after_a_sigkill_is_reconciled_by_the_restarted_server_with_no_call_for_its_key(
    journal: str, point: str, tmp_path: Path
) -> None:
    run = Run(tmp_path, journal)
    url = journal_url(journal, tmp_path)
    run.server = StdioServer(TARGET, url, {**run.server.params.env, **SETTINGS})  # type: ignore[dict-item]
    key = f"mail-{point}"
    async with run.server:
        run.plan.arm(key, point)
        assert await run.server.call("send_email", MAIL, key) is None, "the server should have been killed"
        await run.server.start()  # a new process on the same journal; nothing is called for `key`

        record = await watch(url, key)
        sent = run.outbox.mails()
        invoked = [line for line in run.events.lines() if line.startswith("invoke send_email")]
        assert len(invoked) == 1  # only the killed run; no call since
        if point == "danger_window":
            assert record.state == CallState.COMPLETED
            assert len(sent) == 1 and record.result is not None and sent[0]["id"].encode() in record.result
            again = await run.server.call("send_email", MAIL, key)
            assert again is not None and (again.meta or {}).get("mcp-durable/replayed") is True
        else:
            assert record.state == CallState.RELEASED and "not applied" in (record.error or "")
            assert sent == []
            again = await run.server.call("send_email", MAIL, key)
            assert again is not None and not again.is_error
        assert len(run.outbox.mails()) == 1  # one mail in the end, either way
