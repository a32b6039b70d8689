"""The file journal's index at a size where its hash table grows, loses records and reuses slots."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from mcp_durable.journal import CallIdentity, CallRecord, CallState
from mcp_durable.journal.file import FileJournal
from mcp_durable.journal.file.index import CallIndex

T0 = 1_700_000_000.0


def completed(key: str, expires_at: float | None) -> CallRecord:
    return CallRecord(
        identity=CallIdentity(f"user-{len(key) % 3}", "refund", key),
        fingerprint="f",
        state=CallState.COMPLETED,
        version=1,
        run_id=f"run-{key}",
        attempts=1,
        created_at=T0,
        updated_at=T0,
        expires_at=expires_at,
        result=b'{"key":"%s"}' % key.encode(),
    )


async def test_thousands_of_records_with_purges_and_reuse_are_all_found_before_and_after_reopen(
    tmp_path: Path,
) -> None:
    journal = FileJournal(tmp_path / "j", durability="relaxed")
    await journal.open()
    expected: dict[str, CallRecord] = {}
    for i in range(3000):  # the table starts at 1,024 buckets: it is rebuilt twice on the way
        record = completed(f"k{i}", T0 + 10 if i % 2 else None)
        assert (await journal.claim(record, T0))[0]
        expected[record.identity.key] = record
    assert await journal.purge_expired(T0 + 20) == 1500
    for i in range(1, 3000, 2):
        del expected[f"k{i}"]
    for i in range(3000, 4000):  # new records reuse the freed slots
        record = completed(f"k{i}", None)
        assert (await journal.claim(record, T0 + 20))[0]
        expected[record.identity.key] = record
    await journal.snapshot()
    await journal.claim(completed("after-snapshot", None), T0 + 20)
    expected["after-snapshot"] = completed("after-snapshot", None)

    async def check(j: FileJournal) -> None:
        for record in expected.values():
            assert await j.get(record.identity) == record
        for i in range(1, 3000, 2):
            assert await j.get(completed(f"k{i}", None).identity) is None
        stats = await j.stats()
        assert stats.calls_by_state == {"completed": len(expected)}

    await check(journal)
    await journal.aclose()
    again = FileJournal(tmp_path / "j")
    await again.open()
    try:
        assert again.recovery is not None and again.recovery.snapshot_used is not None
        assert again.recovery.records_loaded == len(expected)
        await check(again)
    finally:
        await again.aclose()


@pytest.mark.parametrize("seed", range(6))
def test_the_hash_table_agrees_with_a_dict_through_inserts_deletes_and_rebuilds(seed: int) -> None:
    rng = random.Random(seed)
    index = CallIndex()
    model: dict[int, int] = {}
    hashes = [rng.getrandbits(128) for _ in range(3000)]
    for step in range(15_000):
        h = rng.choice(hashes)
        roll = rng.random()
        slot = index.find(h)
        assert (slot is None) == (h not in model)
        if slot is not None:
            assert index.version[slot] == model[h]
        if roll < 0.6:
            index.put_fields(h, step, 2, 1.0, None, "refund", "local", step, 10, step)
            model[h] = step
        elif roll < 0.8 and slot is not None:
            index.delete(slot)
            del model[h]
    assert len(index) == len(model) == len(index.state) - index.state.count(0)
    assert all(index.version[index.find(h)] == v for h, v in model.items())  # type: ignore[index]
