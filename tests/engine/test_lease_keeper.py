"""`LeaseKeeper`: one timer renews every lease an engine holds, each on its own schedule, and
stops a run the moment its lease is lost, has run out, or its timeout passes.

Real time, short leases (a renewal every 0.1–0.2 s), a real memory journal: held leases move
forward while held, a released one stops moving, and a lease longer than the others is not
renewed more often than its own interval. A stall of the whole event loop (what a GC pause or
SIGSTOP does to an owner) past the lease stops the run before it goes on to its effect.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from mcp_durable import ToolPolicy
from mcp_durable.engine.leases import LeaseKeeper
from mcp_durable.journal import CallIdentity, CallRecord, CallState, Fence, Journal, Reason, create_journal

OWNER = "me"


def fence_of(identity: CallIdentity) -> Fence:
    return Fence(OWNER, identity.key, 1)  # `claimed` uses the key as the run id


def held(keeper: LeaseKeeper, identity: CallIdentity, policy: ToolPolicy, lost: list[Reason] | None = None) -> object:
    return keeper.kept(
        identity, fence_of(identity), policy, (lost if lost is not None else []).append, time.time() + policy.lease
    )


async def claimed(journal: object, key: str) -> CallIdentity:
    now = time.time()
    identity = CallIdentity("local", "long", key)
    record = CallRecord(
        identity=identity,
        fingerprint="f",
        state=CallState.PENDING,
        version=1,
        run_id=key,
        attempts=1,
        created_at=now,
        updated_at=now,
        owner=OWNER,
        lease_until=now,
    )
    won, _ = await journal.claim(record, now)  # type: ignore[attr-defined]
    assert won
    return identity


async def lease_of(journal: object, identity: CallIdentity) -> float:
    record = await journal.get(identity)  # type: ignore[attr-defined]
    assert record is not None and record.lease_until is not None
    return float(record.lease_until)


async def test_every_held_lease_is_renewed_on_its_own_schedule_and_a_released_one_stops() -> None:
    journal = create_journal("memory://")
    await journal.open()
    keeper = LeaseKeeper(journal, OWNER, time.time)
    short, other, long = [await claimed(journal, k) for k in ("short", "other", "long")]
    renewals: dict[CallIdentity, int] = {short: 0, other: 0, long: 0}
    renew = journal.renew

    async def counting(identity: CallIdentity, fence: Fence, lease_until: float) -> bool:
        renewals[identity] += 1
        return await renew(identity, fence, lease_until)

    journal.renew = counting  # type: ignore[method-assign]
    async with held(keeper, long, ToolPolicy(lease=0.6)):  # type: ignore[attr-defined]  # every 0.2 s
        async with held(keeper, other, ToolPolicy(lease=0.3)):  # type: ignore[attr-defined]  # every 0.1 s
            async with held(keeper, short, ToolPolicy(lease=0.3)):  # type: ignore[attr-defined]
                await anyio.sleep(0.55)
            stopped_at = await lease_of(journal, short)
            assert stopped_at > time.time() - 0.2  # it was renewed while held
            await anyio.sleep(0.35)
            assert await lease_of(journal, other) > time.time()  # still held: still renewed
        assert await lease_of(journal, short) == stopped_at  # released: never renewed again
    assert await lease_of(journal, long) > time.time()
    assert renewals[short] >= 3 and renewals[other] >= 6
    assert 2 <= renewals[long] < renewals[other]  # on its own (slower) schedule
    await journal.aclose()


async def test_a_renewal_that_finds_the_record_taken_over_stops_the_run_once() -> None:
    journal = create_journal("memory://")
    await journal.open()
    keeper = LeaseKeeper(journal, OWNER, time.time)
    identity = await claimed(journal, "taken")
    lost: list[Reason] = []
    async with held(keeper, identity, ToolPolicy(lease=0.3), lost):  # type: ignore[attr-defined]
        record = await journal.get(identity)
        assert record is not None
        # Another owner takes it over (its lease ran out there): the next renewal is refused.
        assert await journal.swap(record.version, record.evolve(owner="other", attempts=2))
        with anyio.fail_after(2):
            while not lost:
                await anyio.sleep(0.02)
        await anyio.sleep(0.3)
    assert lost == [Reason.LOST_OWNER]
    stored = await journal.get(identity)
    assert stored is not None and stored.owner == "other"
    await journal.aclose()


async def test_a_run_past_its_timeout_is_stopped_as_timed_out() -> None:
    journal = create_journal("memory://")
    await journal.open()
    keeper = LeaseKeeper(journal, OWNER, time.time)
    identity = await claimed(journal, "hung")
    lost: list[Reason] = []
    async with held(keeper, identity, ToolPolicy(lease=0.3, timeout=0.25), lost):  # type: ignore[attr-defined]
        with anyio.fail_after(2):
            while not lost:
                await anyio.sleep(0.02)
    assert lost == [Reason.TIMED_OUT]
    await journal.aclose()


async def test_an_owner_stalled_past_its_lease_is_stopped_before_its_run_goes_on(journal_for_stall: Journal) -> None:
    """The whole loop stalls (a blocking call standing in for a GC pause or SIGSTOP) while the
    run waits to make its effect; when the loop runs again, the lease has run out: on a shared
    journal the run is cancelled at its next await, and the effect never happens. On a
    single-writer journal nobody else could have taken the record: the run goes on."""
    journal = journal_for_stall
    keeper = LeaseKeeper(journal, OWNER, time.time)
    identity = await claimed(journal, "stalled")
    lost: list[Reason] = []
    effects: list[str] = []

    def stop(why: Reason) -> None:
        lost.append(why)
        scope.cancel()

    async def stall() -> None:
        await anyio.sleep(0.01)
        time.sleep(0.6)  # the owner stalls: nothing on its loop runs, no renewal is sent

    policy = ToolPolicy(lease=0.3)
    with anyio.CancelScope() as scope:
        async with keeper.kept(identity, fence_of(identity), policy, stop, time.time() + policy.lease):
            async with anyio.create_task_group() as group:
                group.start_soon(stall)
                await anyio.sleep(0.05)  # the run waits (its sleep ends during the stall) …
                await anyio.to_thread.run_sync(lambda: effects.append("effect"))  # … then makes its effect
    if journal.single_writer:
        assert lost == [] and effects == ["effect"]
    else:
        assert lost == [Reason.LOST_OWNER]
        assert effects == []


@pytest.fixture(params=["shared", "single-writer"])
async def journal_for_stall(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Journal]:
    """A SQLite journal shared by processes, where a stalled owner's record can be taken over; and
    a single-writer one (`?single_writer=1`), where no other process can take it."""
    suffix = "?single_writer=1" if request.param == "single-writer" else ""
    journal = create_journal(f"sqlite:///{tmp_path}/journal.db{suffix}")
    await journal.open()
    yield journal
    await journal.aclose()
