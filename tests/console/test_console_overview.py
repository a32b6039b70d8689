"""The console's page data without a browser: the overview's calls-per-minute chart is the
journal's count of the last hour's records per minute (`Journal.count_calls`), over the viewer's
own records only; a call's operator actions are its audit entries (`Journal.audit_entries`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcp_durable.console.queries import call_detail, overview
from mcp_durable.errors import JournalError
from mcp_durable.journal import CallIdentity, CallRecord, CallState, create_journal

NOW = 1_700_000_000.0


async def test_the_chart_counts_the_last_hour_per_minute_without_reading_a_record(tmp_path: Path) -> None:
    journal = create_journal(f"file://{tmp_path}/journal?durability=relaxed")
    await journal.open()
    try:
        created = {
            "too-old": NOW - 3600.5,  # before the hour: not charted
            "first": NOW - 3600,  # the hour's first instant: minute 0
            "minute-0": NOW - 3540.5,
            "minute-1": NOW - 3540,
            "last": NOW - 0.5,  # minute 59
            "future": NOW + 30,  # a clock ahead of ours: counted in the last minute
        }
        for key, at in created.items():
            for principal in ("alice", "bob") if key != "minute-1" else ("alice",):
                record = CallRecord(CallIdentity(principal, "refund", key), "f", CallState.PENDING, 1, "r", 1, at, at)
                await journal.claim(record, 0.0)
                assert await journal.swap(1, record.evolve(state=CallState.COMPLETED, owner=None))
        for segment in (tmp_path / "journal").glob("seg-*.log"):
            os.truncate(segment, 0)  # no record can be read back now: the chart needs none
        with pytest.raises(JournalError):
            await journal.list_calls()
        alice = await overview(journal, "alice", NOW)
        assert alice["per_minute"][0] == 2 and alice["per_minute"][1] == 1 and alice["per_minute"][59] == 2
        assert sum(alice["per_minute"]) == 5 and alice["counts"]["calls"] == 6
        bob = await overview(journal, "bob", NOW)
        assert sum(bob["per_minute"]) == 4 and bob["per_minute"][1] == 0
        everyone = await overview(journal, None, NOW)
        assert sum(everyone["per_minute"]) == 9 and everyone["in_doubt"] == 0
    finally:
        await journal.aclose()


async def test_a_calls_page_reads_its_own_audit_entries_not_the_whole_audit_trail(tmp_path: Path) -> None:
    """The operator actions of a call come from the journal's index of the audit process by call:
    another call's entry that no longer decodes (a number JSON cannot hold) is never read."""
    import sqlite3

    from mcp_durable.journal.base import AUDIT_ENTRY, AUDIT_PROCESS

    url = f"sqlite:///{tmp_path}/journal.db"
    journal = create_journal(url)
    await journal.open()
    try:
        alice = CallIdentity("alice", "refund", "o-1")
        record = CallRecord(alice, "f", CallState.COMPLETED, 1, "r", 1, NOW, NOW)
        await journal.claim(record, NOW)
        for principal, action in (("alice", "rerun"), ("bob", "forget"), ("alice", "resolve")):
            data = {"action": action, "by": "ops", "principal": principal, "tool": "refund", "key": "o-1"}
            await journal.append(AUDIT_PROCESS, AUDIT_ENTRY, data, NOW)
        with sqlite3.connect(tmp_path / "journal.db") as conn:
            conn.execute(
                "UPDATE entries SET data = CAST(? AS BLOB) "
                "WHERE json_extract(CAST(data AS TEXT), '$.principal') = 'bob'",
                ('{"action":"forget","by":"ops","principal":"bob","tool":"refund","key":"o-1","x":1e999}',),
            )
        with pytest.raises(JournalError):
            await journal.entries(process_id=AUDIT_PROCESS)  # the trail as a whole no longer reads
        detail = await call_detail(journal, alice, ())
        assert detail is not None
        assert [a["action"] for a in detail["actions"]] == ["rerun", "resolve"]
    finally:
        await journal.aclose()
