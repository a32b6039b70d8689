"""`mcp-durable journal compact`: a backend offering maintenance (`Maintainable`: the file
journal) is compacted and reports what it did; any other journal is purged of expired records."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from mcp_durable.journal import CallIdentity, CallRecord, CallState, create_journal
from mcp_durable.journal.base import Maintainable
from tests.cli.test_journal_cli import json_lines, run


async def _one_expired_one_live(url: str) -> None:
    journal = create_journal(url)
    await journal.open()
    try:
        now = time.time()
        for key, expires in (("old", now - 10), ("live", now + 3600)):
            record = CallRecord(
                identity=CallIdentity("local", "refund", key),
                fingerprint="f",
                state=CallState.COMPLETED,
                version=1,
                run_id=key,
                attempts=1,
                created_at=now - 20,
                updated_at=now - 20,
                completed_at=now - 20,
                expires_at=expires,
                result=b"{}",
            )
            await journal.claim(record, now - 20)
    finally:
        await journal.aclose()


@pytest.mark.parametrize("scheme", ["file", "sqlite"])
def test_compact_reports_what_it_did(tmp_path: Path, scheme: str) -> None:
    url = f"file://{tmp_path / 'j'}" if scheme == "file" else f"sqlite:///{tmp_path / 'j.db'}"
    anyio.run(_one_expired_one_live, url)
    [body] = json_lines(run("journal", "compact", "--journal", url, "--json"))
    if isinstance(create_journal(url), Maintainable):
        assert scheme == "file"
        assert body["records_purged"] == 1 and body["records_kept"] >= 1
    else:
        assert body == {"purged": 1}
    [listed] = json_lines(run("journal", "list", "--journal", url, "--json"))
    assert listed["key"] == "live"
