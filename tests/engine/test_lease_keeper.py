"""`LeaseKeeper`: one timer renews every lease an engine holds, each on its own schedule.

Real time, short leases (a renewal every 0.1–0.2 s), a real memory journal: held leases move
forward while held, a released one stops moving, and a lease longer than the others is not
renewed more often than its own interval.
"""

from __future__ import annotations

import time

import anyio

from mcp_durable import ToolPolicy
from mcp_durable.journal import CallIdentity, CallRecord, CallState, create_journal
from mcp_durable.leases import LeaseKeeper

OWNER = "me"


async def claimed(journal: object, key: str) -> CallIdentity:
    now = time.time()
    identity = CallIdentity("local", "long", key)
    record = CallRecord(identity=identity, fingerprint="f", state=CallState.PENDING, version=1, run_id=key,
                        attempts=1, created_at=now, updated_at=now, owner=OWNER, lease_until=now)
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

    async def counting(identity: CallIdentity, owner: str, lease_until: float) -> bool:
        renewals[identity] += 1
        return await renew(identity, owner, lease_until)

    journal.renew = counting  # type: ignore[method-assign]
    async with keeper.kept(long, ToolPolicy(lease=0.6)):  # every 0.2 s
        async with keeper.kept(other, ToolPolicy(lease=0.3)):  # every 0.1 s
            async with keeper.kept(short, ToolPolicy(lease=0.3)):
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
