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
  the tasks ready in that pass join its batch;
- the task that skipped has skipped fewer than `SKIPS_PER_PASS` times in this pass. A call makes
  a few writes; a writer appending in a loop with inline commits would otherwise never give the
  loop a pass, and every other task of the loop (requests waiting on a socket, timers) would
  wait for its last append.

A write made outside any call — a process journal's `append` from an agent or a worker, not
from a tool — is a *direct write*. Counted as nothing, it always took the turn, and a writer
appending one entry after another paid a pass of the loop for each. The journals' `append`
brackets its write with `direct_write()` / `direct_done()`:

- a direct write counts as a call of its own, under the rules above, when the running task is
  inside no call (`enter` and `leave` also move a count kept in the task's context). A write
  inside a call — a durable step, an audit entry — is that call's, and counts as nothing more;
- a task's first direct write marks its stretch as overlapping: it takes the turn, and so does
  the task's next write, the first of the next stretch. Writers started together (tasks each
  appending once, or in a loop) each find themselves first, and share one batch, where the
  first of them would otherwise go alone; their next writes take the turn and share one again.
  A writer appending in a loop skips the turn from its third append on while no other writer
  overlaps it. (A task started by one that has written directly inherits that, as it inherits
  the rest of its context: writers it starts together go as one lone write and a batch of the
  rest, as calls do after a quiet stretch.)

Correctness never depends on the turn: a write that skips it is committed alone, with the same
guarantees. Counted per thread (each event loop runs on one), so engines running on loops of
other threads neither count here nor race on the count. A task that cannot be known (no running
asyncio loop: trio) always takes the turn.
"""

from __future__ import annotations

import asyncio
import threading
from contextvars import ContextVar

#: Writes one task may make without the batching turn in one pass of the event loop; the next
#: takes the turn (module docstring).
SKIPS_PER_PASS = 16


class _Callers:
    """This thread's count of calls in flight, whether calls overlapped lately, and the task that
    skipped the turn in this pass."""

    __slots__ = ("count", "overlapping", "crowded", "skipped", "skips")

    def __init__(self) -> None:
        self.count = 0
        #: Two calls or more have been in flight together since the count was last 0.
        self.overlapping = False
        #: Calls overlapped in the last stretch of calls, from a count of 0 back to 0.
        self.crowded = False
        #: The task that skipped the turn in this pass of the loop; None once the pass is over.
        self.skipped: asyncio.Task[object] | None = None
        #: How many times it did.
        self.skips = 0


class _PerThread(threading.local):
    """Each thread's `_Callers`: a plain object held by the thread-local, since every attribute of
    a `threading.local` is a lookup in the thread's dict, and a write reads and sets several."""

    def __init__(self) -> None:
        self.callers = _Callers()


_per_thread = _PerThread()
#: The running task's part, kept in its context (a task started inside a call inherits it): how
#: many calls it is inside, times two, plus one once it has made a direct write. One variable,
#: so that a direct write reads one.
_task: ContextVar[int] = ContextVar("mcp_durable_callers_task", default=0)
_INSIDE = 2
_WROTE = 1


def enter() -> None:
    """One more call in flight on this thread, and the running task inside it (before the call's
    first write is sent)."""
    callers = _per_thread.callers
    callers.count += 1
    if callers.count > 1:
        callers.overlapping = True
    _task.set(_task.get() + _INSIDE)


def leave() -> None:
    """The matching end of one `enter()` (after the call's last write), in the task that entered
    or in one it started after `enter()` (which inherited being inside: see `handed_off`)."""
    callers = _per_thread.callers
    callers.count -= 1
    if callers.count == 0:
        callers.crowded, callers.overlapping = callers.overlapping, False
    task = _task.get()
    if task >= _INSIDE:
        _task.set(task - _INSIDE)


def handed_off() -> None:
    """The running task has started a task that carries on the call it entered and will `leave()`
    it (a background task run): this task is no longer inside that call."""
    task = _task.get()
    if task >= _INSIDE:
        _task.set(task - _INSIDE)


def direct_write() -> _Callers | None:
    """Before a journal's `append` sends its write: count it as a call of its own when the running
    task is inside no call; a task's first such write marks the stretch as overlapping (module
    docstring). What it returns is handed to `direct_done` after the write is durable (the
    thread's count when it counted, else None: a second look-up of the thread-local would cost
    about as much again)."""
    task = _task.get()
    if task >= _INSIDE:
        return None
    # `enter`'s count and `leave`'s below written out, not called: this is every append's path,
    # and a Python call costs about as much as the count itself.
    callers = _per_thread.callers
    callers.count += 1
    if callers.count > 1 or not task:
        # A first write takes the turn, and so does the next write after it (the stretch was
        # crowded): writers started together all find themselves first, and share one batch.
        callers.overlapping = True
        if not task:
            _task.set(_WROTE)
    return callers


def direct_done(counted: _Callers | None) -> None:
    """The matching end of one `direct_write()`, given what it returned."""
    if counted is not None:
        counted.count -= 1
        if counted.count == 0:
            counted.crowded, counted.overlapping = counted.overlapping, False


def in_flight() -> int:
    """Calls in flight on this thread."""
    return _per_thread.callers.count


def alone() -> bool:
    """Whether the running task may skip the batching turn: nobody could join its batch (see the
    module docstring). A True answer marks this pass of the loop as having had its lone writer."""
    callers = _per_thread.callers
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
        callers.skips += 1
        return callers.skips < SKIPS_PER_PASS
    loop = task.get_loop()
    # A mark left by a loop that stopped before its next pass (this thread may run another) is stale.
    if skipped is not None and skipped.get_loop() is loop:
        return False
    callers.skipped = task
    callers.skips = 1
    # Runs at the next pass of the loop (call_soon is first in, first out): until then, any other
    # task finding one call in flight runs in this same pass, and others may be ready with it.
    loop.call_soon(_pass_over)
    return True


def _pass_over() -> None:
    callers = _per_thread.callers
    callers.skipped = None
    callers.skips = 0
