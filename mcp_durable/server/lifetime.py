"""What runs while a face is served: the engine, telemetry and the background jobs.

A server's lifespan is entered once per stdio or in-memory connection and once by the HTTP
session manager, each in its own task, entering and leaving in any order. What the face shares
between connections (the journal, telemetry, recovery and retention, a proxy's upstream) must
run from the first entry until the last exit, whichever connections those are: `Occupancy`
counts them. `BackgroundJobs` runs jobs in a task of their own, not in a task group of the
connection that started them (anyio ties a task group to the task that entered it, and that
connection may leave before the others). `EngineLifetime` is the engine's part of a lifespan,
the same for every face.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio

from ..engine import Engine
from ..errors import JournalError
from ..journal import display_url
from ..operations.telemetry import Telemetry

logger = logging.getLogger(__name__)


class Occupancy:
    """How many connections are inside a lifespan: `enter` says whether this one is the first,
    `leave` whether it was the last. Counted without an await, so two entries made at once
    never both read as first."""

    def __init__(self) -> None:
        self.users = 0

    def enter(self) -> bool:
        first = self.users == 0
        self.users += 1
        return first

    def leave(self) -> bool:
        self.users -= 1
        return self.users == 0


class BackgroundJobs:
    """`jobs` (each runs until cancelled) in one task of their own, from `start` to `stop`."""

    def __init__(self, name: str, jobs: Sequence[Callable[[], Coroutine[Any, Any, None]]]) -> None:
        self.name = name
        self.jobs = tuple(jobs)
        self._running: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._running is not None

    def start(self) -> None:
        """Start the jobs (none configured, or started already: nothing)."""
        if not self.jobs or self._running is not None:
            return

        async def run_jobs() -> None:
            async with anyio.create_task_group() as group:
                for job in self.jobs:
                    group.start_soon(job)

        self._running = asyncio.get_running_loop().create_task(run_jobs(), name=f"{self.name} background")

    async def stop(self) -> None:
        """Cancel the jobs, a pass in flight included, and wait until they have stopped."""
        running, self._running = self._running, None
        if running is None:
            return
        running.cancel()
        with anyio.CancelScope(shield=True):  # the last connection leaving may itself be cancelled
            await asyncio.gather(running, return_exceptions=True)


class EngineLifetime:
    """The engine's part of a face's lifespan (`served`): the engine started on every entry (a
    journal unavailable at the first is retried by the next, and by every durable call);
    telemetry and the background jobs from the first entry; all stopped, and the engine closed,
    at the last exit."""

    def __init__(self, engine: Engine, telemetry: Telemetry | None, jobs: BackgroundJobs) -> None:
        self.engine = engine
        self.telemetry = telemetry
        self.jobs = jobs
        self._occupancy = Occupancy()

    @asynccontextmanager
    async def served(self) -> AsyncIterator[None]:
        first = self._occupancy.enter()
        try:
            started = await self._start_engine()
            if first:
                if started and self.telemetry is not None:
                    await self.telemetry.start(self.engine.journal)
                self.jobs.start()
            yield
        finally:
            if self._occupancy.leave():
                await self._stop()

    async def _start_engine(self) -> bool:
        """Start the engine (opening the journal once); False if the journal is unavailable.

        The server serves anyway (full disk, read-only directory, locked database): every durable
        call retries the start and is refused with `journal_unavailable` until it succeeds, so
        the fault clears without a restart.
        """
        try:
            await self.engine.start()
        except JournalError as exc:
            logger.warning(
                "journal %s unavailable at start: %s", display_url(self.engine.journal.url), display_url(str(exc))
            )
            return False
        return True

    async def _stop(self) -> None:
        await self.jobs.stop()
        if self.telemetry is not None:
            self.telemetry.stop()
        try:
            await self.engine.aclose()
        except JournalError as exc:  # e.g. a full disk: the next boot sees an unclean stop
            logger.warning(
                "journal %s: the stop could not be journaled: %s",
                display_url(self.engine.journal.url),
                display_url(str(exc)),
            )
