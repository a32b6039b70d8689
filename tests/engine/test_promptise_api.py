"""The seed's process API (`mcp_durable.compat.promptise`) over our journals: same names, same replay."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest

from mcp_durable import ConfigError, JournalCorruptError, JournalError, create_journal
from mcp_durable.compat.promptise import (
    FileJournal,
    InMemoryJournal,
    JournalEntry,
    ReplayEngine,
    SeedJournal,
    SQLiteJournal,
    import_seed_files,
    open_journal,
)
from mcp_durable.journal.processes import ProcessJournal
from mcp_durable.journal.processes import ReplayEngine as NativeReplayEngine

STATE = {"context_state": {"a": 1}, "lifecycle_state": "paused", "mission": {"goal": "g"}}


def seed_journals(tmp_path: Path) -> dict[str, SeedJournal]:
    return {
        "memory": InMemoryJournal(),
        "file": FileJournal(base_path=tmp_path / "j"),
        "sqlite": SQLiteJournal(tmp_path / "j.db"),
    }


@pytest.mark.parametrize("kind", ["memory", "file", "sqlite"])
async def test_entries_read_back_exactly_as_written_and_recover_follows_the_seeds_rule(
    tmp_path: Path, kind: str
) -> None:
    async with seed_journals(tmp_path)[kind] as journal:
        when = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
        first = JournalEntry(
            entry_id="e-1",
            process_id="p",
            timestamp=when,
            entry_type="context_update",
            data={"key": "a", "value": {"nested": [1, 2.5, None, "x"]}},
        )
        await journal.append(first)
        await journal.append(JournalEntry(process_id="p", entry_type="state_transition", data={"to_state": "running"}))
        await journal.checkpoint("p", STATE)
        await journal.append(JournalEntry(process_id="p", entry_type="context_update", data={"key": "b", "value": 2}))
        await journal.append(JournalEntry(process_id="p", entry_type="invocation_result", data={"ok": True}))
        await journal.append(
            JournalEntry(process_id="other", entry_type="context_update", data={"key": "z", "value": 0})
        )

        entries = await journal.read("p")
        assert entries[0] == first and entries[0].timestamp == when
        assert [e.entry_type for e in entries] == [
            "context_update",
            "state_transition",
            "checkpoint",
            "context_update",
            "invocation_result",
        ]
        first_update = await journal.read("p", entry_type="context_update", limit=1)
        assert [e.entry_type for e in first_update] == ["context_update"]
        assert await journal.read("p", since=when + timedelta(days=36500)) == []
        assert await journal.last_checkpoint("p") == STATE

        recovered = await ReplayEngine(journal).recover("p")
        assert dict(recovered) == {
            "context_state": {"a": 1, "b": 2},
            "lifecycle_state": "paused",
            "last_entry_type": "invocation_result",
            "entries_replayed": 2,
            "mission": {"goal": "g"},
            "checkpoint": STATE,
        }
        assert recovered.context_state == recovered["context_state"] and recovered.entries_replayed == 2
        fresh = await ReplayEngine(journal).recover("never-seen")
        assert (fresh["context_state"], fresh["lifecycle_state"], fresh["entries_replayed"]) == ({}, "created", 0)


@pytest.mark.parametrize(
    "data",
    [
        {"key": "t", "value": datetime.now(UTC)},
        {"key": "s", "value": {1, 2}},
        {"key": "n", "value": float("nan")},
        {"key": "k", "value": {1: "int key"}},
    ],
    ids=["datetime", "set", "nan", "int-key"],
)
async def test_data_that_would_not_read_back_as_written_is_refused_before_it_is_journaled(
    data: dict[str, object],
) -> None:
    async with InMemoryJournal() as journal:
        with pytest.raises(ValueError):
            await journal.append(JournalEntry(process_id="p", entry_type="context_update", data=data))
        assert await journal.read("p") == []


async def test_a_context_update_without_a_key_is_refused_instead_of_silently_dropped_at_replay() -> None:
    async with InMemoryJournal() as journal:
        with pytest.raises(ValueError, match="key"):
            await journal.append(JournalEntry(process_id="p", entry_type="context_update", data={"a": 1}))


async def test_our_replay_engine_and_the_seeds_read_each_others_entries(tmp_path: Path) -> None:
    native = create_journal(f"file://{tmp_path / 'j'}")
    await native.open()
    try:
        process = ProcessJournal(native, "p")
        await process.update_context(a=1)
        await process.transition("running")
        seed = SeedJournal(native)
        seed.opened = True
        await seed.append(JournalEntry(process_id="p", entry_type="context_update", data={"key": "b", "value": 2}))
        await seed.append(JournalEntry(process_id="p", entry_type="state_transition", data={"to_state": "waiting"}))

        ours = await NativeReplayEngine(native).recover("p")
        theirs = await ReplayEngine(native).recover("p")
        assert ours.context_state == theirs["context_state"] == {"a": 1, "b": 2}
        assert ours.lifecycle_state == theirs["lifecycle_state"] == "waiting"
        assert [e.entry_id for e in await seed.read("p")][:2] == [e.entry_id for e in await seed.read("p")][:2]

        await seed.checkpoint("p", {"context_state": {"c": 3}, "lifecycle_state": "sleeping"})
        await process.update_context(d=4)
        ours = await NativeReplayEngine(native).recover("p")
        assert (ours.context_state, ours.lifecycle_state) == ({"c": 3, "d": 4}, "sleeping")
    finally:
        await native.aclose()


async def test_an_entry_in_an_envelope_of_an_unknown_format_is_an_error_not_a_guess() -> None:
    native = create_journal("memory://")
    await native.open()
    await native.append("p", "context_update", {"mcp-durable/seed-entry": {"format": 99, "data": {}}}, 1.0)
    with pytest.raises(JournalError):
        await NativeReplayEngine(native).recover("p")
    with pytest.raises(JournalError):
        await ReplayEngine(native).recover("p")


def write_seed_files(directory: Path, lines: list[bytes], checkpoint: object | None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "p-1.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
    if checkpoint is not None:
        (directory / "p-1.checkpoint.json").write_bytes(orjson.dumps(checkpoint))


def seed_line(entry_type: str, data: dict[str, object], n: int) -> bytes:
    return orjson.dumps(
        {
            "entry_id": f"id-{n}",
            "process_id": "p-1",
            "timestamp": f"2026-01-01T00:00:0{n}+00:00",
            "entry_type": entry_type,
            "data": data,
        }
    )


async def test_a_directory_of_the_seeds_files_is_refused_not_read_as_empty_and_imports_strictly(tmp_path: Path) -> None:
    old = tmp_path / "old"
    state = {"context_state": {"a": 1}, "lifecycle_state": "running"}
    write_seed_files(
        old,
        [
            seed_line("context_update", {"key": "a", "value": 1}, 1),
            seed_line("checkpoint", {"state": state}, 2),
            seed_line("context_update", {"key": "b", "value": 2}, 3),
        ],
        state,
    )
    with pytest.raises(ConfigError, match="import_seed_files"):
        await FileJournal(base_path=old).read("p-1")

    async with open_journal(f"sqlite:///{tmp_path / 'new.db'}") as new:
        assert await import_seed_files(old, new) == 3
        recovered = await ReplayEngine(new).recover("p-1")
        assert (recovered["context_state"], recovered["entries_replayed"]) == ({"a": 1, "b": 2}, 1)
        assert [e.entry_id for e in await new.read("p-1")] == ["id-1", "id-2", "id-3"]

    torn = tmp_path / "torn"
    write_seed_files(torn, [seed_line("context_update", {"key": "a", "value": 1}, 1), b'{"entry_id": "x", "proc'], None)
    async with InMemoryJournal() as target:
        with pytest.raises(JournalCorruptError) as raised:
            await import_seed_files(torn, target)
        assert raised.value.offset == len(seed_line("context_update", {"key": "a", "value": 1}, 1)) + 1
