"""A process making concurrent claims, renewals and completions on a SQLite journal until killed.

`python -m tests.crash.sqlite_caller URL START CALLERS`: opens the journal, prints `ready`, then
CALLERS concurrent tasks each take the next number n and, for key `k<n>`, claim it, renew its
lease, then complete it with `result_of(n)`; after each of those *returned* the task prints
`claimed n`, `renewed n` or `done n` (flushed), so every acknowledged write is on the parent's
pipe. With many tasks at once the journal's group commit puts many of them in one transaction;
the parent kills this process with SIGKILL at a random moment, often inside a COMMIT.
"""

from __future__ import annotations

import sys

import anyio

from mcp_durable.journal import CallIdentity, CallRecord, CallState, Fence, create_journal

T0 = 1_700_000_000.0
OWNER = "crash-caller"


def identity(n: int) -> CallIdentity:
    return CallIdentity("local", "refund", f"k{n}")


def claim_of(n: int) -> CallRecord:
    """The record the n-th call claims (the parent recomputes it to check what it finds)."""
    return CallRecord(
        identity=identity(n),
        fingerprint=f"f{n}",
        state=CallState.PENDING,
        version=1,
        run_id=f"run-{n}",
        attempts=1,
        created_at=T0 + n,
        updated_at=T0 + n,
        owner=OWNER,
        lease_until=T0 + n + 30,
        arguments=b'{"n":%d}' % n,
    )


def renewed_lease(n: int) -> float:
    return T0 + n + 60


def result_of(n: int) -> bytes:
    return b'{"content":[{"type":"text","text":"refunded %d"}]}' % n + b" " * (n % 300)


def done_of(n: int) -> CallRecord:
    return claim_of(n).evolve(
        state=CallState.COMPLETED,
        owner=None,
        lease_until=None,
        completed_at=T0 + n + 1,
        updated_at=T0 + n + 1,
        result=result_of(n),
    )


async def main(url: str, start: int, callers: int) -> None:
    journal = create_journal(url)
    await journal.open()
    print("ready", flush=True)
    counter = start
    out = sys.stdout

    async def caller() -> None:
        nonlocal counter
        while True:
            n = counter
            counter += 1
            won, _ = await journal.claim(claim_of(n), T0 + n)
            assert won
            out.write(f"claimed {n}\n")
            out.flush()
            assert await journal.renew(identity(n), Fence(OWNER, f"run-{n}", 1), renewed_lease(n))
            out.write(f"renewed {n}\n")
            out.flush()
            assert await journal.swap(1, done_of(n))
            out.write(f"done {n}\n")
            out.flush()

    async with anyio.create_task_group() as group:
        for _ in range(callers):
            group.start_soon(caller)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
