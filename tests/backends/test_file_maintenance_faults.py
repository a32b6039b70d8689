"""The file journal's maintenance (compact, snapshot) maps its storage faults to `JournalError`,
like every method of the contract: an operator's `journal compact` on a damaged journal reports
`journal_unavailable` with the OS error as its cause, not a traceback of an `OSError`."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcp_durable.errors import JournalError
from mcp_durable.journal.file import FileJournal
from tests.contract.test_calls import T0, pending


async def _journal_whose_sealed_segment_is_gone(tmp_path: Path) -> FileJournal:
    journal = FileJournal.from_url(f"file://{tmp_path / 'journal'}")
    await journal.open()
    for i in range(5):
        await journal.claim(pending(f"k{i}"), T0)
    journal._rotate()  # seal the segment holding the records, so a compaction would copy it
    await journal.append("p-1", "state_transition", {"to": "running"}, T0)
    (sealed,) = [p for p in sorted((tmp_path / "journal").glob("seg-*.log"))][:1]
    sealed.unlink()
    return journal


async def test_a_compaction_that_cannot_read_its_segments_fails_with_journal_error(tmp_path: Path) -> None:
    journal = await _journal_whose_sealed_segment_is_gone(tmp_path)
    try:
        with pytest.raises(JournalError) as caught:
            await journal.compact(T0)
        assert isinstance(caught.value.__cause__, OSError)
    finally:
        await journal.aclose()
