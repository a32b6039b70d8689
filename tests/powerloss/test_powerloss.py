"""Power loss, not just kill -9: the short run of the harness, its broken build, and regressions.

The long run (≥ 1,000 cut points per journal) is `python -m tests.powerloss --cuts 1000`
(docs/crash-results.md). Needs strace: skipped without it, failed under `CI`.
"""

from __future__ import annotations

import os

import pytest

from .harness import Options, Summary, run
from .recording import Event
from .strace_log import strace_binary

if strace_binary() is None:
    if os.environ.get("CI"):
        pytest.fail("strace is required in CI for the power-loss harness (apt-get install strace)", pytrace=False)
    pytest.skip("strace is not installed: the power-loss harness cannot record", allow_module_level=True)


def _violations(summary: Summary) -> list[str]:
    return [v.describe() for v in summary.violations[:10]]


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_short_run_loses_no_acknowledged_result_and_no_durable_claim(kind: str) -> None:
    # Two of the crash states also start a second recorded run (the next boot recovers them and
    # goes on), cut again at 10 points each: power lost during or after recovery.
    summary = run(Options(kind, cuts=60, calls=40, variants=2, seed=3, restarts=2, restart_cuts=10))
    assert len(summary.cuts) == 80
    assert summary.states == 160
    assert any(window.startswith("after restart") for window in summary.cuts_by_window)
    assert summary.acks_checked > 0 and summary.claims_checked > 0 and summary.steps_checked > 0
    windows = set(summary.cuts_by_window)
    if kind == "file":
        assert {"rotation", "snapshot", "compaction"} <= windows, summary.cuts_by_window
    else:
        assert {"checkpoint", "compaction", "restart"} <= windows, summary.cuts_by_window
    assert _violations(summary) == []
    assert summary.outcomes["opened"] == summary.states


@pytest.mark.parametrize("skip", ["dir", "data"])
def test_the_harness_catches_a_build_without_one_fsync(skip: str) -> None:
    """MCP_DURABLE_TEST_SKIP_FSYNC (test-only, read in mcp_durable/journal/fsync.py) removes the
    directory fsyncs (`dir`) or the group commit's fdatasync (`data`): acknowledged results
    must then be lost at some cut point."""
    summary = run(Options("file", cuts=40, calls=20, variants=2, seed=5, skip_fsync=skip))
    kinds = {v.kind for v in summary.violations}
    assert "lost_ack" in kinds or "refused" in kinds, kinds


def test_the_harness_catches_sqlite_without_a_sync_per_commit() -> None:
    """The same for SQLite, by configuration: `?synchronous=NORMAL` in WAL mode does not sync the
    WAL at each commit, so committed (acknowledged) transactions are lost by a power cut."""
    summary = run(Options("sqlite", cuts=40, calls=20, variants=2, seed=5, synchronous="NORMAL"))
    assert "lost_ack" in {v.kind for v in summary.violations}


# -- regressions: each defect the harness found, at the cut point that showed it ---------------------


def _first_ack(events: list[Event], _windows: list[str]) -> list[int]:
    """Power lost right after the first result was acknowledged (and at the next few events)."""
    first = next(ev.index for ev in events if ev.marker is not None and ev.marker.get("m") == "ack")
    return list(range(first + 1, first + 4))


def _creation(events: list[Event], windows: list[str]) -> list[int]:
    """Power lost at every event while the journal is being created (up to its first write)."""
    first_writes = ("write seg-", "write journal.db-wal")
    stop = next(ev.index for ev in events if ev.label.startswith(first_writes))
    return list(range(1, stop + 2))


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_a_new_journal_directory_survives_a_power_loss_after_the_first_result(kind: str) -> None:
    """Found by the harness: the journal's directory was created (`mkdir`) without an fsync of
    its parent, so a power loss after the first acknowledged results could take the directory,
    and every result in it, away (both journals; SQLite fsyncs only the directory of its own
    files). Cut: right after the first acknowledged result, durable state only (variant 0)."""
    summary = run(Options(kind, calls=6, variants=1, seed=7, select=_first_ack))
    assert summary.acks_checked > 0
    assert _violations(summary) == []


def test_a_power_loss_while_a_file_journal_is_created_leaves_one_that_opens() -> None:
    """Found by the harness: the first segment was created after the manifest naming it, and its
    name was not fsynced until the next manifest change: a power loss could leave a manifest
    naming a missing segment (the journal refused to open, and the results acknowledged into
    that segment were lost). Cut: every event of the creation, several crash states each."""
    summary = run(Options("file", calls=4, variants=4, seed=7, select=_creation))
    assert _violations(summary) == []
    assert summary.outcomes["opened"] == summary.states


def _until_first_ack(events: list[Event], _windows: list[str]) -> list[int]:
    """Power lost at every event before the first acknowledged result (the journal's creation)."""
    first = next(ev.index for ev in events if ev.marker is not None and ev.marker.get("m") == "ack")
    return list(range(1, first + 2))


def test_a_power_loss_while_a_sqlite_journal_is_created_leaves_a_whole_schema_or_none() -> None:
    """Found by the harness: the schema was created one statement (one transaction) at a time, so
    a power loss could leave `calls` without `entries`; the journal opened (completing it) while
    `journal verify` called the database unreadable. The schema is now one transaction. Cut:
    every event up to the first acknowledged result, several crash states each."""
    summary = run(Options("sqlite", calls=4, variants=3, seed=7, select=_until_first_ack))
    assert _violations(summary) == []
    assert summary.outcomes["opened"] == summary.states
