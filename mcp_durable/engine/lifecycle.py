"""The engine's lifecycle in one place: start (open, sweep orphans, resume tasks), background runs, close.

Starting is idempotent and safe to race (the first caller opens; the others wait for it). A
start marks the calls a previous boot left PENDING as IN_DOUBT (`sweep`), so they show in the
in-doubt list at once, then hands in-doubt tasks to the face and, when configured, journals the
lifecycle of the process (`starting → running`, and `stopping → stopped` at close) as process
`process_id`. A start that fails leaves nothing behind: the background runs it began are
cancelled and the journal is closed, so the next start begins afresh.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio

from ..errors import DurableError
from ..journal.base import CallQuery, Journal, each_call
from ..journal.model import CallRecord, CallState, Reason
from ..journal.processes import ProcessJournal, ReplayEngine
from . import transitions
from .live_owners import LiveOwners
from .tasks import TaskRuns


class LifecycleHost(Protocol):
    """What the lifecycle reads and sets of its engine (`engine.Engine` is one)."""

    journal: Journal
    clock: Callable[[], float]
    instance_id: str
    owners: LiveOwners
    tasks: TaskRuns
    background: set[asyncio.Task[None]]
    closing: bool
    opened: bool
    open_lock: anyio.Lock
    orphans_found: int
    orphans_by_principal: Counter[str]
    process_id: str | None
    lifecycle: ProcessJournal | None
    previous_lifecycle_state: str | None
    started_at: float | None
    start_duration_s: float | None

    def owner_alive(self, record: CallRecord, now: float) -> bool:
        """Whether a PENDING record's owner may still be running it."""
        ...

    async def swap(self, record: CallRecord, new: CallRecord) -> bool:
        """Swap `new` in for `record` and tell the listeners; False if it moved meanwhile."""
        ...


logger = logging.getLogger("mcp_durable.engine")

#: PENDING records read per `list_calls` by `sweep`.
SWEEP_PAGE = 500


async def start(engine: LifecycleHost) -> None:
    """Open the journal (once) and mark calls orphaned by a previous boot as in doubt."""
    async with engine.open_lock:
        if engine.opened:
            return
        began = time.perf_counter()
        engine.started_at = engine.clock()
        before = set(engine.background)
        await engine.journal.open()
        engine.owners.join()
        try:
            await _begin(engine)
        except BaseException:
            await _undo_start(engine, before)
            raise
        engine.start_duration_s = time.perf_counter() - began
        engine.opened = True


async def _begin(engine: LifecycleHost) -> None:
    engine.orphans_found = await sweep(engine)
    engine.closing = False
    await engine.tasks.resume_all()
    if engine.process_id is not None:
        recovered = await ReplayEngine(engine.journal).recover(engine.process_id)
        engine.previous_lifecycle_state = recovered.lifecycle_state
        engine.lifecycle = ProcessJournal(engine.journal, engine.process_id, clock=engine.clock, state=recovered)
        await engine.lifecycle.transition("starting")
        await engine.lifecycle.update_context(instance_id=engine.instance_id, orphans_in_doubt=engine.orphans_found)
        await engine.lifecycle.transition("running")
    # Last: a start that fails before here leaves no watch loop behind.
    if not engine.journal.single_writer and engine.tasks.resumer is not None:
        spawn(engine, engine.tasks.watch())


async def _undo_start(engine: LifecycleHost, before: set[asyncio.Task[None]]) -> None:
    """What a failed start began, undone: its background runs cancelled, the journal closed."""
    begun = [task for task in engine.background if task not in before]
    for task in begun:
        task.cancel()
    if begun:
        await asyncio.gather(*begun, return_exceptions=True)
    engine.owners.leave()
    engine.lifecycle = None
    try:
        await engine.journal.aclose()
    except Exception:  # noqa: BLE001 - the start's own error is the one to raise
        logger.warning("closing the journal after a failed start failed", exc_info=True)


def spawn(engine: LifecycleHost, work: Awaitable[Any]) -> None:
    """Run `work` in the background until it ends or the engine closes; failures are logged."""

    async def guarded() -> None:
        try:
            await work
        except DurableError as exc:  # an answer the task's record already shows (in doubt, cancelled)
            logger.debug("background task run ended: %s", exc)
        except Exception:  # noqa: BLE001 - nobody awaits a background run: log it
            logger.exception("a background task run failed")

    task = asyncio.get_running_loop().create_task(guarded())
    engine.background.add(task)
    task.add_done_callback(engine.background.discard)


async def close(engine: LifecycleHost) -> None:
    """Stop the background runs, journal `stopping → stopped` and close the journal."""
    if not engine.opened:
        return
    # Background tasks stop with the engine; a task's record stays PENDING (the runner leaves a
    # task stopped by the close as it is), so the next start finds it in doubt and resumes it.
    engine.closing = True
    background = list(engine.background)
    for task in background:
        task.cancel()
    if background:
        await asyncio.gather(*background, return_exceptions=True)
    engine.opened = False
    engine.owners.leave()
    try:
        if engine.lifecycle is not None:
            await engine.lifecycle.transition("stopping")
            await engine.lifecycle.transition("stopped")
            await engine.lifecycle.checkpoint()
    finally:
        await engine.journal.aclose()


async def sweep(engine: LifecycleHost) -> int:
    """Mark every PENDING call whose owner is gone as IN_DOUBT (`lost_owner`); returns how many.

    Run at start. On a single-writer journal no other process can own a PENDING record, so
    every one found then is a previous boot's orphan and is marked at once, without waiting
    for its lease. On a shared journal only records whose lease has expired are marked (a
    live owner renews its lease); the others are left to their owners.

    Reads the PENDING records only (the journal's index of open records), `SWEEP_PAGE` at a
    time (`each_call`): every one of them, however many.
    """
    found = 0
    async for record in each_call(engine.journal, CallQuery(state=CallState.PENDING, limit=SWEEP_PAGE)):
        now = engine.clock()
        if engine.owner_alive(record, now):
            continue
        if await engine.swap(record, transitions.doubted(record, Reason.LOST_OWNER, now)):
            found += 1
            engine.orphans_by_principal[record.identity.principal] += 1
    return found
