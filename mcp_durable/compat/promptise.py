"""The seed's process API over mcp-durable's journals, for code written against the seed design.

The durable-execution design this project grew from (promptise's `runtime.journal`) names its
parts `JournalEntry`, `InMemoryJournal`, `FileJournal(base_path=…)`, `journal.append(entry)`,
`journal.checkpoint(process_id, state)`, `journal.read(process_id, …)`,
`journal.last_checkpoint(process_id)` and `ReplayEngine(journal).recover(process_id)`, which
returns a mapping with `context_state`, `lifecycle_state`, `last_entry_type`,
`entries_replayed`, `mission` and `checkpoint`. This module offers those names, with the same
replay rule, over our journals (file, SQLite, Postgres, memory), so such code switches by
changing its imports:

    from mcp_durable.compat.promptise import FileJournal, JournalEntry, ReplayEngine

    journal = FileJournal(base_path="state/journal")
    await journal.append(JournalEntry(process_id="p-1", entry_type="context_update",
                                      data={"key": "last_done", "value": 3}))
    await journal.checkpoint("p-1", {"context_state": {"last_done": 3}, "lifecycle_state": "running"})
    recovered = await ReplayEngine(journal).recover("p-1")
    recovered["context_state"]                        # {"last_done": 3}

What is stronger than the seed: every append is on stable storage when it returns (fsync or a
commit), a torn tail never takes the next entry with it, and recovery reads from the last
checkpoint instead of the whole file. What differs, on purpose:
- Entries read back exactly as written, or not at all. `append` refuses data that would not
  survive the round trip (a datetime, a set, a non-string key, NaN: the seed wrote them with
  `default=str` and read back a different value), and a `context_update` without `key` (the
  seed's replay dropped it silently).
- `FileJournal(base_path)` is our file journal (one writer process at a time), not the seed's
  JSONL files. A directory that holds the seed's files is refused with `ConfigError` rather
  than read as an empty journal; `import_seed_files(directory, journal)` copies them in.
- The journal opens on first use; `close()` releases it (also `async with journal:`).

Entries are stored in a marked envelope (`journal.replay.SEED_ENVELOPE`), so our own
`ReplayEngine`, `journal://processes/{id}` and the CLI read them with the seed's rule too, and
entries our `ProcessJournal` wrote are replayed by this module's engine with ours.
"""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import orjson

from ..errors import ConfigError, JournalCorruptError
from ..journal import Journal, create_journal
from ..journal import JournalEntry as StoredEntry
from ..journal.base import CHECKPOINT
from ..journal.processes import CONTEXT_UPDATE, SEED_ENVELOPE, SEED_FORMAT, RecoveredProcess, apply, seed_envelope

__all__ = [
    "FileJournal",
    "InMemoryJournal",
    "JournalEntry",
    "ReplayEngine",
    "SQLiteJournal",
    "SeedJournal",
    "import_seed_files",
    "open_journal",
]

_ID_NAMESPACE = uuid.UUID("6d63702d-6475-7261-626c-652d73656564")  # stable ids for native entries


class JournalEntry:
    """One entry, as the seed defines it: `entry_id`, `process_id`, `timestamp`, `entry_type`, `data`.

    An empty `entry_id` is replaced by a new one; `timestamp` defaults to now (UTC).
    """

    __slots__ = ("data", "entry_id", "entry_type", "process_id", "timestamp")

    def __init__(
        self,
        entry_id: str = "",
        process_id: str = "",
        timestamp: datetime | None = None,
        entry_type: str = "",
        data: dict[str, Any] | None = None,
    ) -> None:
        self.entry_id = entry_id or str(uuid.uuid4())
        self.process_id = process_id
        self.timestamp = timestamp if timestamp is not None else datetime.now(UTC)
        self.entry_type = entry_type
        self.data: dict[str, Any] = data if data is not None else {}

    def to_dict(self) -> dict[str, Any]:
        return {
            "entry_id": self.entry_id,
            "process_id": self.process_id,
            "timestamp": self.timestamp.isoformat(),
            "entry_type": self.entry_type,
            "data": self.data,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JournalEntry:
        return cls(
            str(data.get("entry_id") or ""),
            str(data.get("process_id", "")),
            datetime.fromisoformat(data["timestamp"]),
            str(data.get("entry_type", "")),
            dict(data.get("data") or {}),
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JournalEntry) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"JournalEntry({self.entry_type!r}, process_id={self.process_id!r}, entry_id={self.entry_id!r})"


def _checked(data: dict[str, Any], what: str) -> dict[str, Any]:
    """`data` if it reads back equal from JSON; else `ValueError` (the seed would have altered it)."""
    try:
        same = orjson.loads(orjson.dumps(data)) == data
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise ValueError(f"{what} is not JSON: {exc}") from exc
    if not same:
        raise ValueError(f"{what} would not read back as written (only JSON types, string keys, finite numbers)")
    return data


def _to_seed(entry: StoredEntry) -> JournalEntry:
    """A stored entry as the seed sees it (native entries get a stable id and their `ts`)."""
    envelope = seed_envelope(entry)
    if envelope is not None:
        return JournalEntry(
            envelope["entry_id"],
            entry.process_id,
            datetime.fromisoformat(envelope["timestamp"]),
            entry.entry_type,
            envelope["data"],
        )
    entry_id = str(uuid.uuid5(_ID_NAMESPACE, f"{entry.process_id}:{entry.seq}"))
    return JournalEntry(entry_id, entry.process_id, datetime.fromtimestamp(entry.ts, UTC), entry.entry_type, entry.data)


class SeedJournal:
    """The seed's journal interface over one of our journals (opened on first use)."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.opened = False
        self._lock = anyio.Lock()

    async def ready(self) -> Journal:
        if not self.opened:
            async with self._lock:
                if not self.opened:
                    await self._check_before_open()
                    await self.journal.open()
                    self.opened = True
        return self.journal

    async def _check_before_open(self) -> None:
        """Hook: refuse to open what would be misread (the file journal checks for seed files)."""

    async def append(self, entry: JournalEntry) -> None:
        """Append `entry` durably. Raises `ValueError` for data that would not read back as written."""
        data = _checked(entry.data, f"data of the {entry.entry_type!r} entry")
        if entry.entry_type == CONTEXT_UPDATE and "key" not in data:
            raise ValueError("a context_update entry needs data {'key': …, 'value': …} (else replay ignores it)")
        envelope = {
            "format": SEED_FORMAT,
            "entry_id": entry.entry_id,
            "timestamp": entry.timestamp.isoformat(),
            "data": data,
        }
        journal = await self.ready()
        await journal.append(entry.process_id, entry.entry_type, {SEED_ENVELOPE: envelope}, entry.timestamp.timestamp())

    async def read(
        self, process_id: str, *, since: datetime | None = None, entry_type: str | None = None, limit: int | None = None
    ) -> list[JournalEntry]:
        """The process's entries in journal order, filtered like the seed's `read`."""
        journal = await self.ready()
        out: list[JournalEntry] = []
        for stored in await journal.entries(process_id=process_id):
            entry = _to_seed(stored)
            if (since is None or entry.timestamp >= since) and (entry_type is None or entry.entry_type == entry_type):
                out.append(entry)
                if limit is not None and len(out) >= limit:
                    break
        return out

    async def checkpoint(self, process_id: str, state: dict[str, Any]) -> None:
        """Record `state` (conventionally `context_state`, `lifecycle_state`, `mission`) as the last checkpoint."""
        await self.append(
            JournalEntry(
                process_id=process_id, entry_type=CHECKPOINT, data={"state": _checked(dict(state), "checkpoint state")}
            )
        )

    async def last_checkpoint(self, process_id: str) -> dict[str, Any] | None:
        """The state of the process's last checkpoint, or None."""
        stored = await (await self.ready()).last_checkpoint(process_id)
        if stored is None:
            return None
        envelope = seed_envelope(stored)
        return dict(envelope["data"].get("state") or {}) if envelope is not None else dict(stored.data)

    async def close(self) -> None:
        if self.opened:
            self.opened = False
            await self.journal.aclose()

    async def __aenter__(self) -> SeedJournal:
        await self.ready()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.journal.url})"


class InMemoryJournal(SeedJournal):
    """Entries in this process only (tests)."""

    def __init__(self) -> None:
        super().__init__(create_journal("memory://"))


class FileJournal(SeedJournal):
    """Our file journal in directory `base_path` (fsynced, checksummed, one writer process)."""

    def __init__(self, base_path: str | os.PathLike[str] = ".mcp-durable/journal") -> None:
        self.base_path = Path(base_path)
        super().__init__(create_journal(f"file://{self.base_path}"))

    async def _check_before_open(self) -> None:
        if (self.base_path / "MANIFEST").exists():
            return
        seed_files = sorted(self.base_path.glob("*.jsonl")) if self.base_path.is_dir() else []
        if seed_files:
            raise ConfigError(
                f"{self.base_path} holds the seed's JSONL journal ({seed_files[0].name}, …), not ours: copy it into a "
                "journal elsewhere with mcp_durable.compat.promptise.import_seed_files(directory, journal)"
            )


class SQLiteJournal(SeedJournal):
    """Our SQLite journal at `path` (several processes on one host)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(create_journal(f"sqlite:///{Path(path).resolve()}"))


def open_journal(url: str) -> SeedJournal:
    """The seed interface over the journal `url` names (`file://`, `sqlite:///`, `postgresql://`, `memory://`)."""
    return SeedJournal(create_journal(url))


class Recovery(dict[str, Any]):
    """What `recover` returns: the seed's mapping, also readable as attributes."""

    @property
    def context_state(self) -> dict[str, Any]:
        return self["context_state"]  # type: ignore[no-any-return]

    @property
    def lifecycle_state(self) -> str:
        return self["lifecycle_state"]  # type: ignore[no-any-return]

    @property
    def entries_replayed(self) -> int:
        return self["entries_replayed"]  # type: ignore[no-any-return]

    @property
    def last_entry_type(self) -> str:
        return self["last_entry_type"]  # type: ignore[no-any-return]


class ReplayEngine:
    """The seed's `ReplayEngine`: the last checkpoint, then every entry after it.

    `recover` returns `context_state`, `lifecycle_state` (`"created"` for a process never
    checkpointed or moved), `last_entry_type`, `entries_replayed` (every entry after the
    checkpoint, as the seed counts), `mission` and `checkpoint` (the raw state, `{}` if none).
    Accepts a `SeedJournal` or one of our `Journal`s.
    """

    def __init__(self, journal: SeedJournal | Journal) -> None:
        if isinstance(journal, SeedJournal):
            self._seed = journal
        else:  # one of our journals, opened by its owner
            self._seed = SeedJournal(journal)
            self._seed.opened = True

    async def recover(self, process_id: str) -> Recovery:
        journal = await self._seed.ready()
        process = RecoveredProcess(process_id, lifecycle_state="created")
        stored_checkpoint = await journal.last_checkpoint(process_id)
        after = 0
        if stored_checkpoint is not None:
            apply(process, stored_checkpoint)
            after = stored_checkpoint.seq
        replayed = await journal.entries(process_id=process_id, after=after)
        for entry in replayed:
            apply(process, entry)
        checkpoint = await self._seed.last_checkpoint(process_id) if stored_checkpoint is not None else None
        return Recovery(
            context_state=process.context_state,
            lifecycle_state=process.lifecycle_state or "created",
            last_entry_type=replayed[-1].entry_type if replayed else "",
            entries_replayed=len(replayed),
            mission=(checkpoint or {}).get("mission"),
            checkpoint=dict(checkpoint or {}),
        )


async def import_seed_files(directory: str | os.PathLike[str], journal: SeedJournal) -> int:
    """Copy the seed's JSONL journal files of `directory` into `journal`; returns the entries copied.

    Strict where the seed was lenient: a line that is not a valid entry raises
    `JournalCorruptError` naming the file and offset (the seed skipped it with a warning), and a
    checkpoint file that disagrees with the last checkpoint entry of its process is an error.
    """
    root = Path(directory)
    copied = 0
    for path in sorted(root.glob("*.jsonl")):
        offset, last_state = 0, None
        for line in path.read_bytes().splitlines(keepends=True):
            if line.strip():
                try:
                    entry = JournalEntry.from_dict(orjson.loads(line))
                except (orjson.JSONDecodeError, KeyError, ValueError, TypeError, AttributeError) as exc:
                    raise JournalCorruptError(str(path), offset, f"not a seed journal entry: {exc}") from exc
                if entry.entry_type == CHECKPOINT:
                    last_state = entry.data.get("state")
                await journal.append(entry)
                copied += 1
            offset += len(line)
        checkpoint_file = path.with_name(path.name.removesuffix(".jsonl") + ".checkpoint.json")
        if checkpoint_file.exists() and orjson.loads(checkpoint_file.read_bytes()) != last_state:
            raise JournalCorruptError(str(checkpoint_file), 0, "differs from the last checkpoint entry of its process")
    return copied
