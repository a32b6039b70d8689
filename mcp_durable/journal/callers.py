"""Whether a journal write has anyone to share its batch with: the calls in flight on this thread.

The batching writers (the file journal's group commit, the SQLite writer, the Postgres batcher)
let every task that is ready run once before a batch closes — the batching turn, one pass of the
event loop — so that concurrent writes share one sync or one statement. A write made alone pays
for that pass for nothing. asyncio says through no public API whether another task is ready;
the engine says how many calls it is inside: `enter()` before a call's first write is sent,
`leave()` after its outcome is written (`engine/live_owners.py`, `Holding` and `LiveOwners.hold`,
which every claim, take-over and task start goes through).

`alone()` — the writer may skip the turn — holds when all of:

- exactly one call is in flight on this thread. With none, the writer is something we know
  nothing about (a test or a tool driving a journal directly, an operator's command, the start-up
  sweep): it takes the turn, as every write did before;
- no two calls were in flight together in this stretch of calls (from a count of 0 back to 0)
  or in the one before. Callers in step (a wave answered by one batch, whose callers all come
  back with their next calls) leave the count at 0 between waves, and the first caller of the
  next wave would find itself alone while the others are about to arrive. After a stretch with
  overlapping calls, the next lone call takes the turn; a stretch of one call at a time after it
  (a sequential caller) skips it again;
- no other task skipped the turn in this pass of the event loop. A call that skips its turns may
  go from its claim to its answer without giving the loop a pass (inline commits, a tool that
  does not wait). Callers whose requests are ready in the same pass would then each find one call
  in flight — the one before them having finished — and go alone one after the other, so that
  concurrent calls never batched. The second task to skip in one pass takes the turn instead, and
  the tasks ready in that pass join its batch.

Correctness never depends on the turn: a write that skips it is committed alone, with the same
guarantees. Counted per thread (each event loop runs on one), so engines running on loops of
other threads neither count here nor race on the count. A task that cannot be known (no running
asyncio loop: trio) always takes the turn.
"""

from __future__ import annotations

import asyncio
import threading


class _Callers(threading.local):
    """This thread's count of calls in flight, whether calls overlapped lately, and the task that
    skipped the turn in this pass."""

    def __init__(self) -> None:
        self.count = 0
        #: Two calls or more have been in flight together since the count was last 0.
        self.overlapping = False
        #: Calls overlapped in the last stretch of calls, from a count of 0 back to 0.
        self.crowded = False
        #: The task that skipped the turn in this pass of the loop; None once the pass is over.
        self.skipped: asyncio.Task[object] | None = None


_callers = _Callers()


def enter() -> None:
    """One more call in flight on this thread (before its first write is sent)."""
    callers = _callers
    callers.count += 1
    if callers.count > 1:
        callers.overlapping = True


def leave() -> None:
    """The matching end of one `enter()` (after the call's last write)."""
    callers = _callers
    callers.count -= 1
    if callers.count == 0:
        callers.crowded, callers.overlapping = callers.overlapping, False


def in_flight() -> int:
    """Calls in flight on this thread."""
    return _callers.count


def alone() -> bool:
    """Whether the running task may skip the batching turn: nobody could join its batch (see the
    module docstring). A True answer marks this pass of the loop as having had its lone writer."""
    callers = _callers
    if callers.count != 1 or callers.overlapping or callers.crowded:
        return False
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running asyncio loop (trio): nothing to go by
        return False
    if task is None:
        return False
    skipped = callers.skipped
    if skipped is task:
        return True
    loop = task.get_loop()
    # A mark left by a loop that stopped before its next pass (this thread may run another) is stale.
    if skipped is not None and skipped.get_loop() is loop:
        return False
    callers.skipped = task
    # Runs at the next pass of the loop (call_soon is first in, first out): until then, any other
    # task finding one call in flight runs in this same pass, and others may be ready with it.
    loop.call_soon(_pass_over)
    return True


def _pass_over() -> None:
    _callers.skipped = None
