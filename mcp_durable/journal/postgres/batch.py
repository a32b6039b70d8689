"""Batching for the Postgres journal: calls of one kind that arrive together share a statement.

`Batcher.submit(item)` adds the item to the open batch. The first item's caller leads it: it
lets every task that is ready run once (their items join), waits for a free slot (at most
`slots` batches of this kind in flight; while it waits, more items join), then closes the batch
and runs `run_batch(items)` — one multi-row statement, one round trip, one commit — and hands
each caller its own result (or exception). Items arriving meanwhile open the next batch.

A batch holds at most `max_items` items; the next item opens the next batch. A batch that is
full when its leader looks for a slot need not wait behind one in flight: up to `full_slots`
more slots serve full batches only. Where many callers move in step (a wave of 64 calls that
all finished their previous step together), the wave then goes out as two statements side by
side instead of one long one during which the whole process waits with nothing to do; where
requests arrive spread out, batches are never full and one stays in flight, so statements per
call do not grow (docs/performance.md, "Waves of callers and full batches").

    claim A ─┐                                                        ┌─▶ A: won
    claim B ─┼─ batch ─▶ INSERT … SELECT … FROM json_to_recordset(…) ──┼─▶ B: lost to the stored record
    claim C ─┘           ON CONFLICT DO NOTHING RETURNING …            └─▶ C: won

With `ordered=True` batches start in the order they were opened: a batch's leader waits until
the batch opened before it has started before it looks for a slot. Without it, a full batch may
take the slot kept for full batches while an earlier batch still waits for the other slot, and
be sent first. The appends need the order (their statements take the entries' lock in the
order sent: journal.py); the other kinds decide each row on its own and do not.

A batch that closes with a single item — calls made one at a time — is sent by `run_one(item)`
when given: a single-row statement, with no JSON array to build and parse and no batch plan.
Such an item still takes the batching turn (one pass of the event loop, so that calls made
together keep sharing a statement) unless its call is the only one in flight
(`journal/callers.py`); it just does not pay for a batch's shape.

Each item still succeeds or fails on its own row (the statements are per-row compare-and-set),
and nobody is answered before the statement's transaction committed. A statement that fails
fails every item of its batch with the same exception. A caller whose anyio cancel scope is
cancelled while its item waits still gets the item's outcome (the item stays in its batch), and
meets the cancellation at its next checkpoint.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import anyio

from ... import observe
from ..callers import alone

I = TypeVar("I")  # noqa: E741 - an item
O = TypeVar("O")  # noqa: E741 - its outcome


class _Batch(Generic[I, O]):
    __slots__ = ("items", "futures", "closed", "outcomes", "started", "after")

    def __init__(self) -> None:
        self.items: list[I] = []
        self.futures: list[asyncio.Future[O]] = []
        self.closed = False
        #: Each item's outcome, set once the statement ended (before the futures are resolved).
        self.outcomes: Sequence[O | BaseException] | None = None
        #: Ordered batchers: set when this batch starts, and the start of the batch opened before.
        self.started: asyncio.Future[None] | None = None
        self.after: asyncio.Future[None] | None = None


class Batcher(Generic[I, O]):
    """Gathers concurrent items into batches run by `run_batch` (see the module docstring).

    `run_batch(items)` returns one outcome per item, in order: a value, or an exception to raise
    in that item's caller. At most `max_items` items share a batch; `full_slots` more slots
    serve only batches that are full. `ordered`: batches start in the order they were opened.
    """

    def __init__(
        self,
        run_batch: Callable[[list[I]], Awaitable[Sequence[O | BaseException]]],
        *,
        slots: int,
        max_items: int = 256,
        full_slots: int = 0,
        run_one: Callable[[I], Awaitable[O]] | None = None,
        ordered: bool = False,
    ) -> None:
        self._run_batch = run_batch
        self._run_one = run_one
        self._slots = anyio.Semaphore(slots)
        self._full_slots = anyio.Semaphore(full_slots) if full_slots > 0 else None
        self._max_items = max_items
        self._open: _Batch[I, O] | None = None
        self._ordered = ordered
        #: Ordered batchers: the start of the batch opened last (the next one starts after it).
        self._last_start: asyncio.Future[None] | None = None
        #: Batches run and items in them (for tests and measurements: items / batches = batch size).
        self.batches = 0
        self.items = 0
        #: Of those, the batches run on a slot kept for full batches (beside another in flight).
        self.beside = 0

    async def submit(self, item: I) -> O:
        batch = self._open
        if batch is None or batch.closed:
            batch = self._open = _Batch()
            if self._ordered:
                batch.after = self._last_start
                batch.started = self._last_start = asyncio.get_running_loop().create_future()
        future: asyncio.Future[O] = asyncio.get_running_loop().create_future()
        index = len(batch.items)
        batch.items.append(item)
        batch.futures.append(future)
        if index + 1 >= self._max_items:
            self._close(batch)
        if index == 0:
            # The leader runs the statement, shielded: a call to the database is not abandoned
            # half-way, and every caller in the batch learns how it ended.
            with anyio.CancelScope(shield=True):
                await self._lead(batch)
                if len(batch.items) > 1:
                    # The callers this batch answered wake at the next turn of the loop, and its
                    # leader, which ran the statement itself, would go on at once. Under CPU load
                    # callers in step then reached their next write spread over two turns, and a
                    # batch closed without some of them (a wave of 32 split 31 + 1; the wave test
                    # in tests/backends/test_postgres_batching.py failed 3 runs in 8 with two
                    # busy-looping processes beside it, none in 14 with this turn).
                    await anyio.lowlevel.checkpoint()
                return await future
        # The others wait unshielded: a cancel scope per item was about a quarter of the client's
        # CPU per append at 64 writers (benchmark case 3; docs/benchmarks.md, issue 34), and a
        # caller is almost never cancelled while it waits. When one is, by its anyio cancel
        # scope, its item stays in the batch and it still learns how the statement ended, as
        # under a shield; the cancellation reaches it at its next checkpoint.
        try:
            return await future
        except anyio.get_cancelled_exc_class():
            if anyio.current_effective_deadline() != -math.inf:
                raise  # not an anyio scope's (a native Task.cancel): a shield would not stop it either
            return await self._outcome_when_cancelled(batch, index)

    async def _outcome_when_cancelled(self, batch: _Batch[I, O], index: int) -> O:
        """Item `index`'s outcome, awaited shielded by a caller whose scope was cancelled while it
        waited (`Task.cancel` cancelled the future it awaited: the outcome comes from the batch,
        or from a new future put in the old one's place)."""
        outcomes = batch.outcomes
        if outcomes is None:
            future: asyncio.Future[O] = asyncio.get_running_loop().create_future()
            batch.futures[index] = future
            with anyio.CancelScope(shield=True):
                await asyncio.wait((future,))
            return future.result()
        outcome = outcomes[index]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _close(self, batch: _Batch[I, O]) -> None:
        batch.closed = True
        if self._open is batch:
            self._open = None

    async def _lead(self, batch: _Batch[I, O]) -> None:
        # Every task that is ready now runs once first: their items join this batch. Skipped
        # where nobody could join (`callers.alone`: this call is the only one in flight).
        if not alone():
            await anyio.lowlevel.checkpoint()
        try:
            if batch.after is not None and not batch.after.done():
                await batch.after  # ordered: the batch opened before this one starts first
            slot = self._take_slot_now(batch)
            if slot is None:
                await self._slots.acquire()
                slot = self._slots
        except BaseException:
            self._started(batch)
            raise
        try:
            await self._run(batch)
        finally:
            slot.release()

    @staticmethod
    def _started(batch: _Batch[I, O]) -> None:
        if batch.started is not None and not batch.started.done():
            batch.started.set_result(None)

    def _take_slot_now(self, batch: _Batch[I, O]) -> anyio.Semaphore | None:
        """A slot free now (without the turn `Semaphore.acquire` always yields): a batch slot, or
        for a full batch one of the slots kept for full batches; None when `batch` must wait."""
        try:
            self._slots.acquire_nowait()
            return self._slots
        except anyio.WouldBlock:
            pass
        if self._full_slots is not None and len(batch.items) >= self._max_items:
            try:
                self._full_slots.acquire_nowait()
                self.beside += 1
                return self._full_slots
            except anyio.WouldBlock:
                pass
        return None

    async def _run(self, batch: _Batch[I, O]) -> None:
        self._close(batch)
        # Ordered: the next batch may start now. Its leader runs at a later turn of the loop, and
        # `run_batch` sends (appends: `Pipeline.rows`) before it awaits anything.
        self._started(batch)
        self.batches += 1
        self.items += len(batch.items)
        began = time.perf_counter()
        try:
            outcomes: Sequence[O | BaseException]
            if len(batch.items) == 1 and self._run_one is not None:
                outcomes = [await self._run_one(batch.items[0])]
            else:
                outcomes = await self._run_batch(batch.items)
            observe.journal_committed("postgres", time.perf_counter() - began, len(batch.items))
            if len(outcomes) != len(batch.items):
                raise RuntimeError(f"a batch of {len(batch.items)} got {len(outcomes)} outcomes")
        except BaseException as exc:  # noqa: BLE001 - every item of the batch fails with it
            outcomes = [exc] * len(batch.items)
        batch.outcomes = outcomes
        for future, outcome in zip(batch.futures, outcomes, strict=True):
            if future.done():
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
