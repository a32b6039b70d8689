"""Keeping a running call's lease: the owner renews it every `lease / 3` while the tool runs.

A lease is how other processes sharing a journal tell a live owner from a dead one: a PENDING
record whose lease has run out belongs to an owner that stopped renewing (it died), and the
in-doubt policy takes over. Renewal is `Journal.renew`, which changes no version, so the
owner's final swap still applies.

One `LeaseKeeper` per engine renews every lease it holds from a single event-loop timer, set
for the earliest renewal due. Holding a lease is a dict insertion and letting it go a removal:
most calls end long before their first renewal, and a timer (or a task group) per call cost
more than a whole no-op call. A renewal runs as a task when it is due, and the next one counts
from its end. A failed renewal (a transient journal error) is skipped, not raised: the tool
goes on, and a lost claim is seen when the result is persisted. Outside asyncio (trio) each
held lease gets a task group of its own instead.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any

import anyio

from . import observe
from .journal.base import Journal
from .journal.model import CallIdentity
from .policy import ToolPolicy


class _Held:
    __slots__ = ("identity", "policy", "due", "renewal")

    def __init__(self, identity: CallIdentity, policy: ToolPolicy, due: float) -> None:
        self.identity = identity
        self.policy = policy
        self.due = due  # loop time of the next renewal; inf while one is in flight
        self.renewal: asyncio.Task[None] | None = None


class LeaseKeeper:
    """Renews `owner`'s leases on `journal`; `clock` gives the wall-clock times leases are in."""

    def __init__(
        self,
        journal: Journal,
        owner: str,
        clock: Callable[[], float],
        on_lost: Callable[[CallIdentity], None] | None = None,
    ) -> None:
        self.journal = journal
        self.owner = owner
        self.clock = clock
        #: Called (synchronously, must not raise) when a renewal finds the record no longer a
        #: PENDING record of this owner: cancelled, resolved, or taken over by another replica.
        #: How the owner of a task learns of a `tasks/cancel` sent to another replica.
        self.on_lost = on_lost
        self._held: dict[CallIdentity, _Held] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._loop: asyncio.AbstractEventLoop | None = None
        self.backend = journal.url.split(":", 1)[0]  # names the journal in telemetry

    def kept(self, identity: CallIdentity, policy: ToolPolicy) -> Any:
        """`async with keeper.kept(identity, policy):` renews the lease on `identity` while inside."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return _kept_by_task(self, identity, policy)
        if loop is not self._loop:  # first use, or a new event loop (tests run several)
            self._loop, self._held, self._timer, self._timer_at = loop, {}, None, math.inf
        return _Holding(self, identity, policy)

    # -- asyncio: one timer ------------------------------------------------------------------------

    def _hold(self, identity: CallIdentity, policy: ToolPolicy) -> _Held:
        assert self._loop is not None
        held = _Held(identity, policy, self._loop.time() + policy.heartbeat_interval)
        self._held[identity] = held
        if held.due < self._timer_at:
            self._schedule(held.due)
        return held

    def _release(self, held: _Held) -> None:
        if self._held.get(held.identity) is held:
            del self._held[held.identity]
        if held.renewal is not None and not held.renewal.done():
            held.renewal.cancel()
        # The timer stays: when it fires with nothing due it simply is not set again.

    def _schedule(self, at: float) -> None:
        assert self._loop is not None
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._loop.call_at(at, self._fire) if at < math.inf else None

    def _fire(self) -> None:
        assert self._loop is not None
        self._timer, self._timer_at = None, math.inf
        now = self._loop.time()
        for held in self._held.values():
            if held.due <= now:
                held.due = math.inf
                held.renewal = self._loop.create_task(self._renew(held))
        self._schedule(min((h.due for h in self._held.values()), default=math.inf))

    async def _renew(self, held: _Held) -> None:
        try:
            renewed = await self.journal.renew(held.identity, self.owner, self.clock() + held.policy.lease)
            if not renewed:
                observe.lease_renewal_failed(self.backend)
                if self.on_lost is not None and self._held.get(held.identity) is held:
                    self.on_lost(held.identity)
        except Exception:  # noqa: BLE001 - a transient journal error must not kill the tool
            observe.lease_renewal_failed(self.backend)
        finally:
            held.renewal = None
            if self._held.get(held.identity) is held and self._loop is not None:
                held.due = self._loop.time() + held.policy.heartbeat_interval
                if held.due < self._timer_at:
                    self._schedule(held.due)


class _Holding:
    """The asyncio form of `LeaseKeeper.kept`: a plain class, cheaper than a generator."""

    __slots__ = ("keeper", "identity", "policy", "held")

    def __init__(self, keeper: LeaseKeeper, identity: CallIdentity, policy: ToolPolicy) -> None:
        self.keeper, self.identity, self.policy = keeper, identity, policy
        self.held: _Held | None = None

    async def __aenter__(self) -> None:
        self.held = self.keeper._hold(self.identity, self.policy)

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.held is not None:
            self.keeper._release(self.held)


@asynccontextmanager
async def _kept_by_task(keeper: LeaseKeeper, identity: CallIdentity, policy: ToolPolicy) -> AsyncIterator[None]:
    async def heartbeat() -> None:
        while True:
            await anyio.sleep(policy.heartbeat_interval)
            try:
                if not await keeper.journal.renew(identity, keeper.owner, keeper.clock() + policy.lease):
                    observe.lease_renewal_failed(keeper.backend)
            except Exception:  # noqa: BLE001 - a transient journal error must not kill the tool
                observe.lease_renewal_failed(keeper.backend)

    async with anyio.create_task_group() as group:
        group.start_soon(heartbeat)
        try:
            yield
        finally:
            group.cancel_scope.cancel()
