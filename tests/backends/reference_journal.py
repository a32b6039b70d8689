"""The reference workload of the file journal's format tests: a fixed sequence of writes (every
call state and reason, claims, swaps, renewals, steps, process entries, a purge, a task, unicode,
bytes that are not UTF-8, a large result) with fixed times and ids, and what a journal holds
after it.

`tests/backends/fixtures/file-journal-v1/` is this workload as the release before the compact
call frames wrote it (call frames `{"t":"call","op":…,"h":…,"r":{…}}`), kept to show that such a
journal still opens and reads the same. It was written by `python -m
tests.backends.reference_journal DIR` on that release; do not regenerate it with a later one.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Any

import anyio

from mcp_durable.journal import CallIdentity, CallRecord, CallState, Fence, Reason
from mcp_durable.journal.base import CHECKPOINT, Journal
from mcp_durable.journal.file import FileJournal

T0 = 1_700_000_000.125
FP = "0123456789abcdef" * 4  # a SHA-256 hex digest's shape
RESULT = b'{"content":[{"type":"text","text":"ok"}],"structuredContent":{"result":"ok"},"isError":false}'
#: A large result, not in orjson's canonical form (spaces), with unicode and escapes.
LARGE = b'{"rows": [' + b", ".join(b'{"id": %d, "name": "caf\xc3\xa9 \\"%d\\""}' % (i, i) for i in range(300)) + b"]}"
BINARY = bytes(range(256))  # not UTF-8


@dataclass
class Expected:
    """What the journal holds after the workload: the latest record of each identity still
    there, and the process entries as `(process_id, entry_type, data, ts)`, in log order."""

    records: dict[CallIdentity, CallRecord] = field(default_factory=dict)
    entries: list[tuple[str, str, dict[str, Any], float]] = field(default_factory=list)
    purged: list[CallIdentity] = field(default_factory=list)


def _claimed(principal: str, tool: str, key: str, n: int, **changes: Any) -> CallRecord:
    record = CallRecord(
        identity=CallIdentity(principal, tool, key),
        fingerprint=FP,
        state=CallState.PENDING,
        version=1,
        run_id=f"{n:032x}",
        attempts=1,
        created_at=T0 + n,
        updated_at=T0 + n,
        owner="4b2cbece7bbb",
        lease_until=T0 + n + 30,
        arguments=b'{"n":%d}' % n,
    )
    return record.evolve(**changes) if changes else record


async def run(journal: Journal, *, snapshot_midway: bool = False) -> Expected:
    """The workload, on an open journal (a `FileJournal` with `snapshot_midway` takes a
    snapshot half-way, so a reader replays part from it and part from the segments)."""
    out = Expected()

    async def claim(record: CallRecord) -> CallRecord:
        assert (await journal.claim(record, record.created_at))[0]
        out.records[record.identity] = record
        return record

    async def swap(old: CallRecord, **changes: Any) -> CallRecord:
        new = old.evolve(**changes)
        assert await journal.swap(old.version, new)
        out.records[new.identity] = new
        return new

    async def append(process_id: str, entry_type: str, data: dict[str, Any], ts: float) -> None:
        await journal.append(process_id, entry_type, data, ts)
        out.entries.append((process_id, entry_type, data, ts))

    await append("server/reference", "state_transition", {"from": None, "to": "running"}, T0)
    # The derived-key call of the benchmark, claimed then completed.
    done = await claim(_claimed("local", "noop", "sha256:" + FP, 1))
    await swap(
        done,
        state=CallState.COMPLETED,
        owner=None,
        lease_until=None,
        completed_at=T0 + 1.5,
        updated_at=T0 + 1.5,
        expires_at=T0 + 1.5 + 86400,
        result=RESULT,
    )
    # Unicode everywhere, a deliberate error kept as FAILED.
    failed = await claim(_claimed("ålice", "réfund", "O-ü-1", 2, arguments='{"note":"naïve ☃"}'.encode()))
    await swap(
        failed,
        state=CallState.FAILED,
        owner=None,
        lease_until=None,
        completed_at=T0 + 3,
        updated_at=T0 + 3,
        error="refusé: ☃",
        result='{"isError":true,"content":[{"type":"text","text":"☃"}]}'.encode(),
    )
    # Bytes that are not UTF-8, and a large result.
    binary = await claim(_claimed("local", "blob", "b-1", 3, arguments=BINARY))
    await swap(
        binary,
        state=CallState.COMPLETED,
        owner=None,
        lease_until=None,
        completed_at=T0 + 4,
        updated_at=T0 + 4,
        result=BINARY[::-1],
    )
    large = await claim(_claimed("local", "report", "r-1", 4))
    await swap(
        large,
        state=CallState.COMPLETED,
        owner=None,
        lease_until=None,
        completed_at=T0 + 5,
        updated_at=T0 + 5,
        expires_at=T0 + 10**6,
        result=LARGE,
    )
    # A task, cancelled by its requestor.
    task = await claim(_claimed("local", "slow", "t-1", 5, task_id="task-0001-ü"))
    await swap(
        task,
        state=CallState.RELEASED,
        owner=None,
        lease_until=None,
        updated_at=T0 + 6,
        reason=Reason.REQUESTOR_CANCELLED,
        error="cancelled by the task's requestor",
    )
    if snapshot_midway:
        assert isinstance(journal, FileJournal) and await journal.snapshot() is not None
    # A run with durable steps, its lease renewed, then timed out (IN_DOUBT with a reason).
    stepped = await claim(_claimed("local", "transfer", "x-1", 6))
    fence = Fence(stepped.owner or "", stepped.run_id, stepped.attempts)
    for index in (0, 1):
        data = {"index": index, "moved": index * 10}
        assert await journal.append_step(stepped.identity, fence, index, {"moved": index * 10}, T0 + 6.5)
        out.entries.append((f"steps/{stepped.run_id}", "step", data, T0 + 6.5))
    assert await journal.renew(stepped.identity, fence, T0 + 60)
    renewed = dataclasses.replace(stepped, lease_until=T0 + 60)  # a renewal keeps the version
    out.records[stepped.identity] = renewed
    await swap(
        renewed,
        state=CallState.IN_DOUBT,
        owner=None,
        lease_until=None,
        updated_at=T0 + 70,
        reason=Reason.TIMED_OUT,
        error="took 30 s",
    )
    # One still running, one attempt in, and a record that expires and is purged.
    await claim(_claimed("bob", "noop", "k-1", 7))
    gone = await claim(_claimed("local", "noop", "gone", 8))
    await swap(
        gone,
        state=CallState.COMPLETED,
        owner=None,
        lease_until=None,
        completed_at=T0 + 9,
        updated_at=T0 + 9,
        expires_at=T0 + 10,
        result=RESULT,
    )
    assert await journal.purge_expired(T0 + 11) == 1
    del out.records[gone.identity]
    out.purged.append(gone.identity)
    await append("server/reference", CHECKPOINT, {"context_state": {"n": 1}, "lifecycle_state": "running"}, T0 + 12)
    return out


async def _write(directory: str) -> None:
    journal = FileJournal(directory)
    await journal.open()
    try:
        await run(journal)
    finally:
        await journal.aclose()


if __name__ == "__main__":
    anyio.run(_write, sys.argv[1])
