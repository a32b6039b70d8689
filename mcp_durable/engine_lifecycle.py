"""The engine's lifecycle: choose the journal, start (open, sweep orphans, resume tasks), close.

`Lifecycle` is a part of `Engine` (engine_state.py). Starting is idempotent and safe to race
(the first caller opens; the others wait for it). A start marks the calls a previous boot left
PENDING as IN_DOUBT (`sweep`), so they show in the in-doubt list at once, then hands in-doubt
tasks to the face and, when configured, journals the lifecycle of the process (`starting →
running`, and `stopping → stopped` at close) as process `process_id`.
"""

from __future__ import annotations

import asyncio
import time

from .engine_state import EngineState
from .errors import ConfigError
from .journal.base import CallCursor, CallQuery, Journal
from .journal.model import CallState
from .journal.replay import ProcessJournal, ReplayEngine
from .leases import LeaseKeeper
from .live_owners import LiveOwners


class Lifecycle(EngineState):
    """The lifecycle half of `Engine` (see the module docstring). Not used on its own."""

    def use_journal(self, journal: Journal) -> None:
        """Run on `journal` instead of the one given at construction; only before `start()`.

        Everything that reads or writes the journal (calls, lease renewal, the lifecycle, the
        single-writer owner set) goes to this one: the lease keeper and the owners' view are
        rebuilt on it, so no part of the engine keeps the old journal. Raises `ConfigError`
        once started.
        """
        if self._opened:
            raise ConfigError("the journal cannot be replaced once the engine has started")
        self._use(journal)

    def _use(self, journal: Journal) -> None:
        self.journal = journal
        self.owners = LiveOwners(journal, self.instance_id)
        # A lease found lost ends a task's run here (a cancel on another replica): `_lease_lost`.
        self.leases = LeaseKeeper(journal, self.instance_id, self.clock, on_lost=self._lease_lost)
        self._claim_reads = bool(getattr(journal, "claim_reads", False))

    async def start(self) -> None:
        """Open the journal (once) and mark calls orphaned by a previous boot as in doubt."""
        if self._opened:
            return
        async with self._open_lock:
            if self._opened:
                return
            began = time.perf_counter()
            self.started_at = self.clock()
            await self.journal.open()
            self.owners.join()
            self.orphans_found = await self.sweep()
            self._closing = False
            await self.resume_tasks()
            if not self.journal.single_writer and self.task_resumer is not None:
                self.spawn(self._watch_tasks())
            if self.process_id is not None:
                recovered = await ReplayEngine(self.journal).recover(self.process_id)
                self.previous_lifecycle_state = recovered.lifecycle_state
                self.lifecycle = ProcessJournal(self.journal, self.process_id, clock=self.clock, state=recovered)
                await self.lifecycle.transition("starting")
                await self.lifecycle.update_context(instance_id=self.instance_id, orphans_in_doubt=self.orphans_found)
                await self.lifecycle.transition("running")
            self.start_duration_s = time.perf_counter() - began
            self._opened = True

    async def aclose(self) -> None:
        """Stop the background runs, journal `stopping → stopped` and close the journal."""
        self._finals.clear()
        if self._opened:
            # Background tasks stop with the engine; a task's record stays PENDING (see
            # `_release_after`), so the next start finds it in doubt and resumes it.
            self._closing = True
            background = list(self._background)
            for task in background:
                task.cancel()
            if background:
                await asyncio.gather(*background, return_exceptions=True)
            self._opened = False
            self.owners.leave()
            try:
                if self.lifecycle is not None:
                    await self.lifecycle.transition("stopping")
                    await self.lifecycle.transition("stopped")
                    await self.lifecycle.checkpoint()
            finally:
                await self.journal.aclose()

    async def sweep(self) -> int:
        """Mark every PENDING call whose owner is gone as IN_DOUBT; returns how many.

        Run at start. On a single-writer journal no other process can own a PENDING record, so
        every one found then is a previous boot's orphan and is marked at once, without waiting
        for its lease. On a shared journal only records whose lease has expired are marked (a
        live owner renews its lease); the others are left to their owners.
        """
        found = 0
        cursor: CallCursor | None = None
        while True:
            page = await self.journal.list_calls(CallQuery(state=CallState.PENDING, limit=500, cursor=cursor))
            if not page:
                return found
            cursor = CallCursor.after(page[-1])
            for record in page:
                now = self.clock()
                if self.owner_alive(record, now):
                    continue
                doubted = record.evolve(state=CallState.IN_DOUBT, owner=None, lease_until=None, updated_at=now)
                if await self.journal.swap(record.version, doubted):
                    found += 1
                    self.orphans_by_principal[record.identity.principal] += 1
                    await self.notify_changed(doubted)
