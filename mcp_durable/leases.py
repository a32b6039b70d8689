"""Keeping a running call's lease: the owner renews it every `lease / 3` while the tool runs.

A lease is how other processes sharing a journal tell a live owner from a dead one: a PENDING
record whose lease has run out belongs to an owner that stopped renewing (it died), and the
in-doubt policy takes over. Renewal is `Journal.renew`, which changes no version, so the
owner's final swap still applies.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio

from .journal.base import Journal
from .journal.model import CallIdentity
from .policy import ToolPolicy


@asynccontextmanager
async def lease_kept(
    journal: Journal,
    owner: str,
    clock: Callable[[], float],
    identity: CallIdentity,
    policy: ToolPolicy,
) -> AsyncIterator[None]:
    """Renew `owner`'s lease on `identity` every `policy.heartbeat_interval` while inside.

    On asyncio a timer on the loop, not a task per call: starting and cancelling a task group
    for every call cost ~100 µs, more than a whole no-op call. A renewal runs as a task only
    when one is due (a call shorter than the interval starts none); leaving cancels the timer
    and a renewal in flight. Elsewhere (trio), a task group. A failed renewal (a transient
    journal error) is skipped, not raised: the tool goes on, and a lost claim is seen when the
    result is persisted.
    """

    async def renew() -> None:
        try:
            await journal.renew(identity, owner, clock() + policy.lease)
        except Exception:  # noqa: BLE001 - a transient journal error must not kill the tool
            pass

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is None:
        async def heartbeat() -> None:
            while True:
                await anyio.sleep(policy.heartbeat_interval)
                await renew()

        async with anyio.create_task_group() as group:
            group.start_soon(heartbeat)
            try:
                yield
            finally:
                group.cancel_scope.cancel()
        return

    timer: asyncio.TimerHandle | None = None
    renewal: asyncio.Task[None] | None = None
    inside = True

    def schedule(_: object = None) -> None:
        nonlocal timer
        if inside:
            timer = loop.call_later(policy.heartbeat_interval, due)

    def due() -> None:
        nonlocal renewal
        renewal = loop.create_task(renew())
        renewal.add_done_callback(schedule)  # the next one counts from the end of this one

    schedule()
    try:
        yield
    finally:
        inside = False
        if timer is not None:
            timer.cancel()
        if renewal is not None and not renewal.done():
            renewal.cancel()
