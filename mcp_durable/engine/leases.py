"""Keeping a running call's lease, and stopping the run the moment it is no longer the owner's.

A lease is how other processes sharing a journal tell a live owner from a dead one: a PENDING
record whose lease has run out belongs to an owner that stopped renewing, and the in-doubt
policy takes over. The owner renews every `lease / 3` while its run lasts, with
`Journal.renew(identity, fence, …)`: accepted only while the record is still PENDING under the
owner's fence (owner, run, attempt), so a renewal never revives a record another owner took.

A hold ends its run (calls `on_lost` with the reason, once, and stops renewing) when:

- a renewal finds the record no longer held under its fence (taken over, resolved, cancelled):
  `LOST_OWNER`;
- the lease it last confirmed has run out by the event loop's clock (renewals failing, or this
  process stalled — a GC pause, SIGSTOP, a frozen VM): `LOST_OWNER`. Checked before anything
  else when the loop runs again, so a stalled owner's run is cancelled at its next await.
  Only on a journal shared by processes: on a single-writer journal no other process can take
  the record over, so a stall there costs time, not ownership:

      owner A ── renews ── stalls ……………… (lease runs out) …………… runs again ─▶ cancelled
      owner B ──────────────────────── takes over ── runs ── records

- the policy's `timeout` has passed since the run began: `TIMED_OUT`.

One `LeaseKeeper` per engine watches every hold from a single event-loop timer, set for the
earliest renewal, lease end or timeout due. Holding is a dict insertion and letting go a
removal: most calls end long before their first renewal, and a timer (or a task group) per
call would cost more than the call itself. A renewal runs as a task when it is due; the next one
counts from its end. A renewal that raises (a transient journal error) is skipped: the lease
end it could not extend then stops the run. Outside asyncio (trio) each hold gets a task
group of its own instead.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any

import anyio

from .. import observe
from ..journal.base import Journal
from ..journal.model import CallIdentity, Fence, Reason
from ..policy import ToolPolicy

#: Told (synchronously, must not raise) why a hold's run must stop: LOST_OWNER or TIMED_OUT.
OnLost = Callable[[Reason], None]


class _Held:
    __slots__ = ("identity", "fence", "policy", "on_lost", "due", "lease_end", "timeout_at", "renewal", "lost")

    def __init__(
        self,
        identity: CallIdentity,
        fence: Fence,
        policy: ToolPolicy,
        on_lost: OnLost,
        now: float,
        lease_left: float | None,
    ) -> None:
        self.identity = identity
        self.fence = fence
        self.policy = policy
        self.on_lost = on_lost
        self.due = now + policy.heartbeat_interval  # loop time of the next renewal; inf while one is in flight
        #: Loop time the lease last confirmed runs out (inf: not watched, a single-writer journal).
        self.lease_end = math.inf if lease_left is None else now + lease_left
        self.timeout_at = math.inf if policy.timeout is None else now + policy.timeout
        self.renewal: asyncio.Task[None] | None = None
        self.lost = False

    def next_at(self) -> float:
        return min(self.due, self.lease_end, self.timeout_at)


class LeaseKeeper:
    """Renews `owner`'s leases on `journal`; `clock` gives the wall-clock times leases are in."""

    def __init__(self, journal: Journal, owner: str, clock: Callable[[], float]) -> None:
        self.journal = journal
        self.owner = owner
        self.clock = clock
        self._held: dict[CallIdentity, _Held] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._loop: asyncio.AbstractEventLoop | None = None
        self.backend = journal.url.split(":", 1)[0]  # names the journal in telemetry
        #: Whether a lease run out by this process's clock stops the run (a shared journal only).
        self.watch_lease_end = not journal.single_writer

    def kept(
        self, identity: CallIdentity, fence: Fence, policy: ToolPolicy, on_lost: OnLost, lease_until: float
    ) -> Any:
        """`async with keeper.kept(...):` renews the lease on `identity` under `fence` while inside,
        and calls `on_lost` when the run must stop (module docstring). `lease_until` is the
        record's lease as written (wall-clock seconds)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return _kept_by_task(self, identity, fence, policy, on_lost)
        if loop is not self._loop:  # first use, or a new event loop (tests run several)
            self._loop, self._held, self._timer, self._timer_at = loop, {}, None, math.inf
        return _Holding(self, identity, fence, policy, on_lost, lease_until)

    # -- asyncio: one timer ------------------------------------------------------------------------

    def hold(
        self, identity: CallIdentity, fence: Fence, policy: ToolPolicy, on_lost: OnLost, lease_until: float
    ) -> _Held:
        assert self._loop is not None
        lease_left = min(policy.lease, lease_until - self.clock()) if self.watch_lease_end else None
        held = _Held(identity, fence, policy, on_lost, self._loop.time(), lease_left)
        self._held[identity] = held
        at = held.next_at()
        if at < self._timer_at:
            self._schedule(at)
        return held

    def release(self, held: _Held) -> None:
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
        for held in list(self._held.values()):
            # The lease end and the timeout first: after a stall, a run whose lease ran out is
            # stopped before any renewal could pretend otherwise.
            if held.timeout_at <= now:
                self._lose(held, Reason.TIMED_OUT)
            elif held.lease_end <= now:
                observe.lease_renewal_failed(self.backend)
                self._lose(held, Reason.LOST_OWNER)
            elif held.due <= now:
                held.due = math.inf
                held.renewal = self._loop.create_task(self._renew(held, now))
        self._schedule(min((h.next_at() for h in self._held.values()), default=math.inf))

    def _lose(self, held: _Held, why: Reason) -> None:
        """Stop renewing `held` and tell its run why it must stop (once)."""
        self.release(held)
        if not held.lost:
            held.lost = True
            held.on_lost(why)

    async def _renew(self, held: _Held, started: float) -> None:
        assert self._loop is not None
        try:
            renewed = await self.journal.renew(held.identity, held.fence, self.clock() + held.policy.lease)
            if renewed:
                if self.watch_lease_end:
                    held.lease_end = started + held.policy.lease
            else:
                observe.lease_renewal_failed(self.backend)
                if self._held.get(held.identity) is held:
                    held.renewal = None
                    self._lose(held, Reason.LOST_OWNER)
                return
        except Exception:  # noqa: BLE001 - a transient journal error: the lease end decides
            observe.lease_renewal_failed(self.backend)
        held.renewal = None
        if self._held.get(held.identity) is held:
            held.due = self._loop.time() + held.policy.heartbeat_interval
            at = held.next_at()
            if at < self._timer_at:
                self._schedule(at)


class _Holding:
    """The asyncio form of `LeaseKeeper.kept`: a plain class rather than a generator (it is on every call's path)."""

    __slots__ = ("keeper", "identity", "fence", "policy", "on_lost", "lease_until", "held")

    def __init__(
        self,
        keeper: LeaseKeeper,
        identity: CallIdentity,
        fence: Fence,
        policy: ToolPolicy,
        on_lost: OnLost,
        lease_until: float,
    ) -> None:
        self.keeper, self.identity, self.fence, self.policy = keeper, identity, fence, policy
        self.on_lost, self.lease_until = on_lost, lease_until
        self.held: _Held | None = None

    async def __aenter__(self) -> None:
        self.held = self.keeper.hold(self.identity, self.fence, self.policy, self.on_lost, self.lease_until)

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.held is not None:
            self.keeper.release(self.held)


@asynccontextmanager
async def _kept_by_task(
    keeper: LeaseKeeper, identity: CallIdentity, fence: Fence, policy: ToolPolicy, on_lost: OnLost
) -> AsyncIterator[None]:
    """The same hold outside asyncio: a heartbeat task; the lease end checked at each beat."""

    async def heartbeat() -> None:
        began = anyio.current_time()
        lease_end = began + policy.lease
        timeout_at = math.inf if policy.timeout is None else began + policy.timeout
        while True:
            await anyio.sleep(max(0.0, min(policy.heartbeat_interval, timeout_at - anyio.current_time())))
            now = anyio.current_time()
            if now >= timeout_at:
                on_lost(Reason.TIMED_OUT)
                return
            if keeper.watch_lease_end and now >= lease_end:
                on_lost(Reason.LOST_OWNER)
                return
            try:
                if not await keeper.journal.renew(identity, fence, keeper.clock() + policy.lease):
                    observe.lease_renewal_failed(keeper.backend)
                    on_lost(Reason.LOST_OWNER)
                    return
                lease_end = now + policy.lease
            except Exception:  # noqa: BLE001 - a transient journal error: the lease end decides
                observe.lease_renewal_failed(keeper.backend)

    async with anyio.create_task_group() as group:
        group.start_soon(heartbeat)
        try:
            yield
        finally:
            group.cancel_scope.cancel()
