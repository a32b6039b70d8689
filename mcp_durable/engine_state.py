"""What every part of the engine shares: its state, the change notification, and one swap.

`Engine` (engine.py) is assembled from parts, each a base class in its own module and each a
subclass of `EngineState`:

- `engine_lifecycle.Lifecycle` — `start`, `aclose`, `sweep`, `use_journal`;
- `call_decisions.CallDecisions` — what an existing record means for a call (`_decide`), the
  take-over and reconcile it may lead to, and the cache of final records that answers repeats;
- `task_runs.TaskRuns` — MCP tasks;
- `engine.Engine` itself — the call (`execute`, `_run`, `_persist`, releases) and operator actions.

The state is declared here once (and set by `Engine.__init__`); so are the methods one part
calls on another, for the type checker only (`if TYPE_CHECKING`), since their code is elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import anyio

from .journal.base import Journal
from .journal.model import CallIdentity, CallRecord
from .journal.replay import ProcessJournal
from .leases import LeaseKeeper
from .live_owners import LiveOwners
from .outcomes import CallOutcome, ChangeListener, Encoder, Runner, TaskResumer, ToolOutcome
from .policy import ToolPolicy
from .runtimes import RunTimes
from .steps import DurableCall

logger = logging.getLogger("mcp_durable.engine")


class EngineState:
    """The engine's state and shared primitives (see the module docstring). Not used on its own."""

    journal: Journal
    clock: Callable[[], float]
    instance_id: str
    #: Whose PENDING records are alive, this instance's running calls counted (live_owners.py).
    owners: LiveOwners
    leases: LeaseKeeper
    #: The journal's claim answers a repeat as cheaply as a read (SQLite, Postgres): no read before it.
    _claim_reads: bool
    listeners: list[ChangeListener]
    run_times: RunTimes
    task_resumer: TaskResumer | None
    task_policy: Callable[[str], ToolPolicy | None]
    task_watch_interval: float
    _background: set[asyncio.Task[None]]
    _task_scopes: dict[CallIdentity, anyio.CancelScope]
    _closing: bool
    #: Recently seen COMPLETED / FAILED records and their replay answers (`CallDecisions._remember`).
    _finals: dict[CallIdentity, tuple[CallRecord, CallOutcome]]
    _opened: bool
    _open_lock: anyio.Lock
    orphans_found: int
    orphans_by_principal: Counter[str]
    process_id: str | None
    lifecycle: ProcessJournal | None
    previous_lifecycle_state: str | None
    started_at: float | None
    start_duration_s: float | None

    def owner_alive(self, record: CallRecord, now: float) -> bool:
        """Whether the owner of a PENDING record may still be running its tool (`LiveOwners.alive`)."""
        return self.owners.alive(record, now)

    async def notify_changed(self, record: CallRecord) -> None:
        """Tell the listeners (resources, notifications) of a change. Never raises: a listener's
        failure must not fail, or leave half-done, the call whose record changed."""
        if not record.state.is_final:
            self._finals.pop(record.identity, None)
        # A final record is not kept here but when a repeat reads it (`_decide`): most calls are
        # never repeated, and keeping each one made the long-lived heap grow by a record per
        # call, which is what triggers the interpreter's full (whole-heap) collections.
        for listener in self.listeners:
            try:
                # A synchronous listener (ours are) costs no coroutine: two changes per call.
                pending = listener(record)
                if pending is not None:
                    await pending
            except Exception:  # noqa: BLE001 - best effort, logged
                logger.exception("a journal change listener failed")

    async def _swap(self, record: CallRecord, new: CallRecord) -> bool:
        """Swap `record` for `new` and tell the listeners; False (nothing changed) if it moved meanwhile."""
        if await self.journal.swap(record.version, new):
            await self.notify_changed(new)
            return True
        return False

    if TYPE_CHECKING:  # one part's methods that another calls

        async def start(self) -> None: ...

        def spawn(self, work: Awaitable[Any]) -> None: ...

        async def resume_tasks(self) -> int: ...

        async def _watch_tasks(self) -> None: ...

        def _lease_lost(self, identity: CallIdentity) -> None: ...

        def _remember(self, record: CallRecord) -> None: ...

        def _fresh(
            self, identity: CallIdentity, fingerprint: str, args_json: bytes, policy: ToolPolicy, now: float,
            task_id: str | None = None,
        ) -> CallRecord: ...

        async def _decide(
            self, record: CallRecord, policy: ToolPolicy, run: Runner, encode: Encoder | None, deadline: float
        ) -> CallOutcome | None: ...

        async def _run(self, record: CallRecord, policy: ToolPolicy, run: Runner) -> CallOutcome: ...

        async def _persist(
            self, record: CallRecord, policy: ToolPolicy, outcome: ToolOutcome
        ) -> tuple[CallRecord, bool]: ...

        async def _release(self, record: CallRecord, policy: ToolPolicy, reason: str) -> None: ...

        def _lease_kept(self, identity: CallIdentity, policy: ToolPolicy) -> AbstractAsyncContextManager[None]: ...

        async def _run_cancellable(
            self, identity: CallIdentity, run: Runner, call: DurableCall
        ) -> ToolOutcome | None: ...
