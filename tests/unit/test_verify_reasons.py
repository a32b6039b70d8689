"""`verify_sqlite` reads a call row's `reason` as the journal does: a value no release wrote is
reported with the row; a file from before the column existed verifies as it did."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from mcp_durable.journal import CallIdentity, CallRecord, CallState, Reason, create_journal
from mcp_durable.journal.integrity import verify_sqlite

T0 = 1_700_000_000.0


async def written(path: Path) -> None:
    journal = create_journal(f"sqlite:///{path}")
    await journal.open()
    for key, reason in (("a", Reason.LOST_OWNER), ("b", None)):
        record = CallRecord(
            identity=CallIdentity("local", "refund", key),
            fingerprint="f" * 64,
            state=CallState.IN_DOUBT if reason else CallState.PENDING,
            version=1,
            run_id=f"run-{key}",
            attempts=1,
            created_at=T0,
            updated_at=T0,
            reason=reason,
        )
        assert (await journal.claim(record, T0))[0]
    await journal.aclose()


async def test_known_reasons_and_none_verify_and_an_unknown_one_is_reported_with_its_row(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    await written(path)
    assert verify_sqlite(path).ok
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE calls SET reason = 'bored' WHERE key = 'a'")
    conn.close()
    report = verify_sqlite(path)
    assert [("refund/a" in p.path, p.reason) for p in report.problems] == [(True, "unknown reason 'bored'")]


async def test_a_file_without_the_reason_column_verifies_as_before(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    await written(path)
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE calls DROP COLUMN reason")
    conn.close()
    report = verify_sqlite(path)
    assert report.ok and report.records == 2
