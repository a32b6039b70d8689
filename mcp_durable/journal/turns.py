"""One turn of the event loop for a batch to fill, skipped when no other task could use it.

Group commit (the file journal) and statement batching (Postgres) let every task that is ready
run once before a batch closes, so that concurrent writes share one sync or one statement. A
write made alone (a sequential caller, the common case at low load) paid for that turn all the
same: a poll of the selector and a pass of the loop, ~8 µs, twice per durable miss (the claim,
then the result). On asyncio the loop's queue of ready callbacks says whether any task could run
in that turn; when it is empty, nobody can join the batch and the turn is skipped.

The SQLite writer hands a lone op over at once for the same reason (`no_task_ready`), instead of
at the next turn. A task woken by I/O in the turn (a new request on a socket) could not join
either: it is far from its own write. Other event loops (trio, uvloop) have no such queue to
look at and always take the turn.
"""

from __future__ import annotations

import asyncio

import anyio.lowlevel


def no_task_ready() -> bool:
    """True when the running asyncio loop has no callback due this turn, so no other task could
    run in it; False when that cannot be known (another event loop).

    Cancelled callbacks do not count: the loop drops them unrun. There often is one: a reader
    callback psycopg removed after its socket became readable (`remove_reader` cancels the
    handle the selector had already queued), so a sequential Postgres miss took the turn for
    nothing at both of its statements.
    """
    loop = asyncio._get_running_loop()  # the C accessor: None outside asyncio (trio)
    ready = getattr(loop, "_ready", None)  # BaseEventLoop's deque of callbacks due this turn
    if ready is None:
        return False
    for handle in ready:  # a few at most
        if not handle.cancelled():
            return False
    return True


async def let_ready_tasks_join() -> None:
    """Yield one turn of the event loop unless no task is ready to run (asyncio only)."""
    if not no_task_ready():
        await anyio.lowlevel.checkpoint()
