"""The journal contract for `purge_expired_calls`: expired records go with the durable steps of
their runs, and the caller learns which; runs unchanged against every backend."""

from __future__ import annotations

from mcp_durable.journal import CallIdentity, CallQuery, CallRecord, CallState, CountQuery, Journal
from mcp_durable.journal.base import STEP, step_process_id
from tests.contract.test_calls import T0, pending


async def _completed(journal: Journal, key: str, expires_at: float | None, principal: str = "local") -> CallRecord:
    _, record = await journal.claim(pending(key, principal=principal), T0)
    assert record.fence is not None
    assert await journal.append_step(record.identity, record.fence, 0, {"name": "a", "result": 1}, T0)
    assert await journal.append_step(record.identity, record.fence, 1, {"name": "b", "result": 2}, T0)
    done = record.evolve(state=CallState.COMPLETED, owner=None, result=b"{}", expires_at=expires_at)
    assert await journal.swap(record.version, done)
    return done


async def _purge_all(journal: Journal, now: float, limit: int) -> tuple[list[tuple[CallIdentity, str]], int]:
    calls: list[tuple[CallIdentity, str]] = []
    steps = 0
    while True:
        done = await journal.purge_expired_calls(now, limit)
        assert len(done.calls) <= limit or not calls  # more than `limit` only all at once
        if not done.calls:
            return calls, steps
        calls += done.calls
        steps += done.step_entries


async def test_expired_records_go_with_their_steps_and_the_caller_learns_which(journal: Journal) -> None:
    old = [await _completed(journal, f"old-{n}", T0 + 10 + n, ("alice", "bob")[n % 2]) for n in range(5)]
    kept = await _completed(journal, "kept", T0 + 1000)
    forever = await _completed(journal, "forever", None)
    await journal.append("steps/unrelated", STEP, {"index": 0, "name": "x"}, T0)
    await journal.append("server/x", "state_transition", {"to": "running"}, T0)
    calls, steps = await _purge_all(journal, T0 + 100, 2)
    assert sorted(calls) == sorted((r.identity, r.run_id) for r in old) and steps == 10
    for record in old:
        assert await journal.get(record.identity) is None
        assert await journal.entries(process_id=step_process_id(record.run_id)) == []
    for record in (kept, forever):
        assert await journal.get(record.identity) == record
        assert len(await journal.entries(process_id=step_process_id(record.run_id))) == 2
    assert len(await journal.entries(process_id="steps/unrelated")) == 1
    assert len(await journal.entries(process_id="server/x")) == 1
    counts = await journal.count_calls()
    assert counts == CountQuery().count(await journal.list_calls(CallQuery(limit=100))) and counts.total == 2
    assert (await journal.stats()).entries == 6
    assert await journal.purge_expired_calls(T0 + 100) == type(await journal.purge_expired_calls(T0))()


async def test_a_page_is_the_earliest_expiries_and_fewer_than_its_limit_means_none_is_left(journal: Journal) -> None:
    # Retention stops at the first page that drops fewer records than it asked for (one commit
    # less per pass): that holds only if a page takes as many as have expired, up to its limit.
    records = [await _completed(journal, f"k-{n}", T0 + 10 + n) for n in range(7)]
    later = await _completed(journal, "later", T0 + 500)
    first = await journal.purge_expired_calls(T0 + 100, 3)
    if len(first.calls) == len(records):  # a backend that drops all expired at once (memory)
        rest = first.calls
    else:
        assert sorted(first.calls) == sorted((r.identity, r.run_id) for r in records[:3])
        second = await journal.purge_expired_calls(T0 + 100, 3)
        assert sorted(second.calls) == sorted((r.identity, r.run_id) for r in records[3:6])
        last = await journal.purge_expired_calls(T0 + 100, 3)
        assert last.calls == ((records[6].identity, records[6].run_id),)  # 1 < 3: the end
        rest = first.calls + second.calls + last.calls
    assert len(rest) == 7
    assert (await journal.purge_expired_calls(T0 + 100, 3)).calls == ()
    assert await journal.get(later.identity) == later


async def test_a_record_is_purged_at_its_expiry_not_before(journal: Journal) -> None:
    record = await _completed(journal, "k", T0 + 50)
    assert (await journal.purge_expired_calls(T0 + 49.5)).calls == ()
    done = await journal.purge_expired_calls(T0 + 50)
    assert done.calls == ((record.identity, record.run_id),) and done.step_entries == 2


async def test_a_record_claimed_anew_after_its_expiry_is_not_purged(journal: Journal) -> None:
    old = await _completed(journal, "k", T0 + 50)
    won, fresh = await journal.claim(pending("k", owner="B").evolve(run_id="run-new"), T0 + 60)
    assert won
    assert (await journal.purge_expired_calls(T0 + 70)).calls == ()
    assert await journal.get(old.identity) == fresh


async def test_a_purged_task_is_no_longer_found(journal: Journal) -> None:
    _, record = await journal.claim(pending("k").evolve(task_id="t-1"), T0)
    await journal.swap(record.version, record.evolve(state=CallState.FAILED, owner=None, expires_at=T0 + 1))
    assert len((await journal.purge_expired_calls(T0 + 1)).calls) == 1
    assert await journal.get_task("local", "t-1") is None


async def test_the_engines_purge_drops_expired_records_with_their_steps(journal: Journal) -> None:
    """`Engine.purge_expired` (the admin tool `journal_purge_expired`): the steps of a purged run
    go with it, on every backend."""
    from mcp_durable.engine import Engine

    old = await _completed(journal, "old", T0 + 10)
    kept = await _completed(journal, "kept", T0 + 1000)
    engine = Engine(journal, clock=lambda: T0 + 100)
    assert await engine.purge_expired() == 1
    assert await journal.get(old.identity) is None
    assert await journal.entries(process_id=step_process_id(old.run_id)) == []
    assert len(await journal.entries(process_id=step_process_id(kept.run_id))) == 2
