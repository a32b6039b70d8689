"""`Journal.renew` extends only a PENDING record's lease, and only under its owner's fence: every
other record (missing, completed, failed, in doubt, released) is left unchanged and the answer
is False. Runs unchanged against every backend (`test_fencing.py` checks the fence's parts)."""

from __future__ import annotations

import pytest

from mcp_durable.journal import CallIdentity, CallState, Fence, Journal
from tests.contract.test_calls import T0, pending


async def test_renewing_a_missing_record_fails(journal: Journal) -> None:
    assert not await journal.renew(CallIdentity("local", "refund", "absent"), Fence("A", "run-absent", 1), T0 + 100)
    assert await journal.get(CallIdentity("local", "refund", "absent")) is None


@pytest.mark.parametrize("state", [s for s in CallState if s != CallState.PENDING])
async def test_renewing_a_record_that_is_not_pending_fails(journal: Journal, state: CallState) -> None:
    _, record = await journal.claim(pending(owner="A"), T0)
    # The owner is kept on purpose: only the state says the record is no longer running.
    moved = record.evolve(state=state, result=b"{}" if state != CallState.RELEASED else None)
    assert await journal.swap(record.version, moved)
    stored_before = await journal.get(record.identity)
    assert stored_before is not None and stored_before.owner == "A"
    # The fence the owner held while it was PENDING: same owner, run and attempt.
    assert not await journal.renew(record.identity, Fence("A", record.run_id, record.attempts), T0 + 100)
    assert await journal.get(record.identity) == stored_before
