"""SIGKILL a process whose SQLite journal group-commits many calls at once: nothing acknowledged
is lost, nothing is half-written.

Each trial starts `tests/crash/sqlite_caller.py` (32 tasks claiming, renewing and completing
calls, so most transactions hold several calls; it prints each write after it returned), kills
it with SIGKILL after a random delay (often inside a COMMIT), then opens the database here:
- every acknowledged claim, renewal and completion is there;
- every record is exactly one of the states the calls write (claimed, renewed, completed), never
  a mix, and its fields are the ones written (no half-written record, no stray one);
- SQLite's own integrity check passes, and the journal takes new calls after the crash.
Trials run in groups of four on one database, so later trials crash a database a crash left.

Trials: `$MCP_DURABLE_TRIALS` (default 12, about 20 s).
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import sqlite3
import time
from pathlib import Path

from mcp_durable.journal import CallQuery, CallState, create_journal
from tests.crash.kill import kill_when_ready
from tests.crash.sqlite_caller import claim_of, done_of, identity, renewed_lease
from tests.journal_kept import kept_disagreements

TRIALS = int(os.environ.get("MCP_DURABLE_TRIALS", "12"))
CALLERS = 32


def run_caller(url: str, start: int, delay: float) -> tuple[dict[str, set[int]], int]:
    """Start a caller process, SIGKILL it `delay` s after it is ready; its acks and exit code."""
    out, code = kill_when_ready("tests.crash.sqlite_caller", [url, str(start), str(CALLERS)], delay)
    acks: dict[str, set[int]] = {"claimed": set(), "renewed": set(), "done": set()}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in acks and parts[1].isdigit():  # a line cut by the kill is no ack
            acks[parts[0]].add(int(parts[1]))
    return acks, code


async def test_a_batch_killed_mid_commit_loses_no_acknowledged_call_and_half_writes_none(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("MCP_DURABLE_SEED", time.time_ns())))
    acked_total = 0
    next_n = 0
    path = tmp_path / "none.db"
    acked: dict[str, set[int]] = {}
    for trial in range(TRIALS):
        if trial % 4 == 0:
            path = tmp_path / f"journal-{trial}.db"
            acked = {"claimed": set(), "renewed": set(), "done": set()}
        url = f"sqlite:///{path}"
        acks, code = run_caller(url, next_n, rng.uniform(0.05, 0.6))
        assert code == -signal.SIGKILL
        for kind, ns in acks.items():
            acked[kind] |= ns
        acked_total += sum(len(ns) for ns in acks.values())
        next_n += 1_000_000

        check = sqlite3.connect(path)
        try:
            assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        finally:
            check.close()
        journal = create_journal(url)
        await journal.open()
        try:
            stored = {r.identity.key: r for r in await journal.list_calls(CallQuery(limit=10_000_000))}
            for n in acked["claimed"] | acked["renewed"] | acked["done"]:
                assert f"k{n}" in stored, f"trial {trial}: acknowledged call {n} is missing"
            for key, record in stored.items():
                n = int(key[1:])
                claimed, done = claim_of(n), done_of(n)
                if record.state == CallState.COMPLETED:
                    assert record == done, f"trial {trial}: completed record {n} differs from what was written"
                    continue
                assert n not in acked["done"], f"trial {trial}: acknowledged completion {n} is lost"
                if record.lease_until == renewed_lease(n):
                    expected = dataclasses.replace(claimed, lease_until=renewed_lease(n))
                    assert record == expected, f"trial {trial}: record {n}"
                else:
                    assert n not in acked["renewed"], f"trial {trial}: acknowledged renewal {n} is lost"
                    assert record == claimed, f"trial {trial}: claimed record {n} differs from what was written"
            # The kept counts and the open listing are written in the same transactions as the
            # records: a kill mid-commit leaves both or neither.
            assert await kept_disagreements(journal) == [], f"trial {trial}"
            # The journal takes calls after the crash.
            fresh = claim_of(next_n - 1)
            won, _ = await journal.claim(fresh, fresh.created_at)
            assert won and await journal.get(identity(next_n - 1)) == fresh
        finally:
            await journal.aclose()
    print(f"{TRIALS} trials, {acked_total} acknowledged writes")
    assert acked_total > 0
