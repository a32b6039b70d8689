"""The process journal's API: journaling a process's state, and `ReplayEngine.recover()`.

A process (an agent, a worker, the server itself) journals two kinds of entries:
- `context_update`: `data` is merged into the process's context state (a dict update);
- `state_transition`: `data["to"]` is its new lifecycle state (`data["from"]` is informative);
and, from time to time, a `checkpoint` whose `data` holds the whole state
(`{"context_state": {...}, "lifecycle_state": ...}`).

`ReplayEngine(journal).recover(process_id)` loads the last checkpoint and replays the
`context_update` and `state_transition` entries after it. Journal levels: `none` writes
nothing, `checkpoint` writes only checkpoints, `full` writes every entry.

Entries written through the seed's API (`mcp_durable.compat.promptise`) keep the seed's shapes
(`context_update {key, value}`, `state_transition {to_state}`, `checkpoint {state}`) inside a
marked envelope, `data = {SEED_ENVELOPE: {"format": 1, "entry_id", "timestamp", "data"}}`. `apply`
reads both shapes, so either API recovers what the other wrote; an envelope of an unknown format
is an error, never a guess.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ..errors import ConfigError, JournalError
from .base import CHECKPOINT, Journal
from .model import JournalEntry

CONTEXT_UPDATE = "context_update"
STATE_TRANSITION = "state_transition"
JournalLevel = Literal["none", "checkpoint", "full"]
#: The data key of an entry written through `mcp_durable.compat.promptise`; native data never uses it.
SEED_ENVELOPE = "mcp-durable/seed-entry"
SEED_FORMAT = 1


@dataclass(slots=True)
class RecoveredProcess:
    """A process's state as the journal rebuilt it."""

    process_id: str
    context_state: dict[str, Any] = field(default_factory=dict)
    lifecycle_state: str | None = None
    entries_replayed: int = 0
    checkpoint_seq: int | None = None
    last_seq: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def seed_envelope(entry: JournalEntry) -> dict[str, Any] | None:
    """The seed envelope of `entry` (None for a native entry). Raises `JournalError` for a bad one."""
    envelope = entry.data.get(SEED_ENVELOPE) if len(entry.data) == 1 else None
    if envelope is None:
        if SEED_ENVELOPE in entry.data:
            raise JournalError(f"entry {entry.seq} of {entry.process_id!r} mixes a seed envelope with other data")
        return None
    if (
        not isinstance(envelope, dict)
        or envelope.get("format") != SEED_FORMAT
        or not isinstance(envelope.get("data"), dict)
    ):
        raise JournalError(f"entry {entry.seq} of {entry.process_id!r} has a seed envelope this version cannot read")
    return envelope


def apply(process: RecoveredProcess, entry: JournalEntry) -> None:
    """Fold one entry into a process state (the replay rule, in one place)."""
    envelope = seed_envelope(entry)
    if envelope is not None:
        _apply_seed(process, entry, envelope["data"])
    elif entry.entry_type == CONTEXT_UPDATE:
        process.context_state.update(entry.data)
    elif entry.entry_type == STATE_TRANSITION:
        process.lifecycle_state = entry.data.get("to")
    elif entry.entry_type == CHECKPOINT:
        process.context_state = dict(entry.data.get("context_state", {}))
        process.lifecycle_state = entry.data.get("lifecycle_state")
        process.checkpoint_seq = entry.seq
    process.last_seq = max(process.last_seq, entry.seq)


def _apply_seed(process: RecoveredProcess, entry: JournalEntry, data: dict[str, Any]) -> None:
    """The seed's replay rule for an entry written the seed's way (promptise's `ReplayEngine`)."""
    if entry.entry_type == CONTEXT_UPDATE and "key" in data:
        process.context_state[data["key"]] = data.get("value")
    elif entry.entry_type == STATE_TRANSITION and data.get("to_state"):
        process.lifecycle_state = data["to_state"]
    elif entry.entry_type == CHECKPOINT:
        state = data.get("state") or {}
        process.context_state = dict(state.get("context_state") or {})
        process.lifecycle_state = state.get("lifecycle_state", "running")
        process.checkpoint_seq = entry.seq
    process.last_seq = max(process.last_seq, entry.seq)


class ReplayEngine:
    """Rebuilds process state from a journal: the last checkpoint plus the entries after it."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    async def recover(self, process_id: str) -> RecoveredProcess:
        process = RecoveredProcess(process_id)
        after = 0
        checkpoint = await self.journal.last_checkpoint(process_id)
        if checkpoint is not None:
            apply(process, checkpoint)
            after = checkpoint.seq
        for entry in await self.journal.entries(process_id=process_id, after=after):
            if entry.entry_type in (CONTEXT_UPDATE, STATE_TRANSITION):
                apply(process, entry)
                process.entries_replayed += 1
        return process


class ProcessJournal:
    """Journals one process at a journal level; keeps the state it wrote, for checkpoints."""

    def __init__(
        self,
        journal: Journal,
        process_id: str,
        *,
        level: JournalLevel = "full",
        clock: Callable[[], float] = time.time,
        state: RecoveredProcess | None = None,
    ) -> None:
        if level not in ("none", "checkpoint", "full"):
            raise ConfigError(f"journal level must be none, checkpoint or full, not {level!r}")
        self.journal = journal
        self.process_id = process_id
        self.level = level
        self.clock = clock
        self.state = state or RecoveredProcess(process_id)

    async def update_context(self, **updates: Any) -> None:
        self.state.context_state.update(updates)
        if self.level == "full":
            await self.journal.append(self.process_id, CONTEXT_UPDATE, updates, self.clock())

    async def transition(self, to: str) -> None:
        previous, self.state.lifecycle_state = self.state.lifecycle_state, to
        if self.level == "full":
            await self.journal.append(self.process_id, STATE_TRANSITION, {"from": previous, "to": to}, self.clock())

    async def checkpoint(self) -> JournalEntry | None:
        if self.level == "none":
            return None
        data = {"context_state": self.state.context_state, "lifecycle_state": self.state.lifecycle_state}
        return await self.journal.append(self.process_id, CHECKPOINT, data, self.clock())
