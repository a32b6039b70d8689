"""The journal contract for `audit_entries` (the operator audit entries of one call): runs
unchanged against every backend."""

from __future__ import annotations

from typing import Any

from mcp_durable.journal import CallIdentity, Journal
from mcp_durable.journal.base import AUDIT_ENTRY, AUDIT_PROCESS
from tests.conftest import JournalFactory
from tests.contract.test_calls import T0


def audit(identity: CallIdentity, action: str) -> dict[str, Any]:
    return {"action": action, "principal": identity.principal, "tool": identity.tool, "key": identity.key}


ALICE = CallIdentity("alice", "refund", "o-1")
BOB = CallIdentity("bob", "refund", "o-1")


async def test_the_audit_entries_of_a_call_are_found_in_order_and_no_others(journal: Journal) -> None:
    first = await journal.append(AUDIT_PROCESS, AUDIT_ENTRY, audit(ALICE, "resolve"), T0)
    await journal.append(AUDIT_PROCESS, AUDIT_ENTRY, audit(BOB, "forget"), T0)  # another principal's call
    await journal.append(AUDIT_PROCESS, AUDIT_ENTRY, audit(CallIdentity("alice", "ship", "o-1"), "cancel"), T0)
    await journal.append("elsewhere", AUDIT_ENTRY, audit(ALICE, "not an audit"), T0)  # another process
    await journal.append(AUDIT_PROCESS, "note", audit(ALICE, "another type"), T0)
    await journal.append(AUDIT_PROCESS, AUDIT_ENTRY, {"action": "odd", "principal": 1, "tool": 2}, T0)
    second = await journal.append(AUDIT_PROCESS, AUDIT_ENTRY, audit(ALICE, "rerun"), T0 + 1)
    assert await journal.audit_entries(ALICE) == [first, second]
    assert [e.data["action"] for e in await journal.audit_entries(BOB)] == ["forget"]
    assert await journal.audit_entries(CallIdentity("carol", "refund", "o-1")) == []
    # An entry appended after a first question is found too.
    third = await journal.append(AUDIT_PROCESS, AUDIT_ENTRY, audit(ALICE, "resolve"), T0 + 2)
    assert await journal.audit_entries(ALICE) == [first, second, third]


async def test_dropped_audit_entries_are_not_found(journal: Journal) -> None:
    old = await journal.append(AUDIT_PROCESS, AUDIT_ENTRY, audit(ALICE, "resolve"), T0)
    assert await journal.audit_entries(ALICE) == [old]
    new = await journal.append(AUDIT_PROCESS, AUDIT_ENTRY, audit(ALICE, "rerun"), T0)
    assert await journal.purge_entries([AUDIT_PROCESS], before_seq=new.seq) == 1
    assert await journal.audit_entries(ALICE) == [new]


async def test_audit_entries_are_found_after_close_and_reopen(journal_factory: JournalFactory) -> None:
    first = journal_factory()
    await first.open()
    try:
        written = [await first.append(AUDIT_PROCESS, AUDIT_ENTRY, audit(c, "forget"), T0) for c in (ALICE, BOB, ALICE)]
    finally:
        await first.aclose()
    second = journal_factory()
    await second.open()
    try:
        assert await second.audit_entries(ALICE) == [written[0], written[2]]
    finally:
        await second.aclose()
