"""`memory://`: a journal held in this process only. For tests and benchmarks; nothing survives."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Hashable
from typing import Any

from .base import (
    ALL_CALLS,
    CHECKPOINT,
    OPEN_STATES,
    RECENT_CALLS,
    STEP,
    CallCounts,
    CallQuery,
    ChangeSignals,
    CountQuery,
    PurgedCalls,
    RecoveryReport,
    audited_call,
    sort_key,
    step_process_id,
)
from .model import CallIdentity, CallRecord, CallState, Fence, JournalEntry, JournalStats
from .record_json import step_data, step_index
from .tally import Facts, RecordTally


class MemoryJournal:
    """A `Journal` in a dict. Single event loop, so every method is trivially atomic."""

    single_writer = True

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._calls: dict[CallIdentity, CallRecord] = {}
        self._entries: list[JournalEntry] = []
        self._dropped = 0  # tombstones (`_DROPPED`) in `_entries`
        self._checkpoints: dict[str, JournalEntry] = {}
        self._tasks: dict[tuple[str, str], CallIdentity] = {}
        #: (process id, step index) → how many stored entries are that step (`step_index`): more
        #: than one only through plain `append`, which never refuses a duplicate.
        self._steps: dict[tuple[str, int], int] = {}
        self._signals = ChangeSignals()
        self.recovery: RecoveryReport | None = None
        #: The audit entries of each call (`audit_entries`), as appended (dropped ones stay here
        #: and are skipped on read).
        self._audits: dict[CallIdentity, list[JournalEntry]] = {}
        # Counts, records by creation time and by expiry: what the file journal keeps too, so
        # counting and purging here cost what they cost there (`tally.py`).
        self._tally: RecordTally[CallIdentity] = RecordTally(self._facts, list, (_name, _name, _state_name))
        #: The PENDING and IN_DOUBT records (`OPEN_STATES`) by state and whether each is a task:
        #: what a listing of those states reads instead of every record (`list_calls`).
        self._open: dict[tuple[CallState, bool], set[CallIdentity]] = {
            (state, task): set() for state in OPEN_STATES for task in (False, True)
        }

    def _facts(self, identity: CallIdentity) -> Facts | None:
        record = self._calls.get(identity)
        return None if record is None else _facts_of(record)

    def _store(self, record: CallRecord, before: CallRecord | None) -> None:
        identity = record.identity
        self._calls[identity] = record
        if before is not None and before.created_at == record.created_at:
            # A swap or renewal (the identity, so principal and tool, is the same): only the
            # state and expiry can move in the tally.
            self._tally.moved(
                identity,
                identity.principal,
                identity.tool,
                (before.state, before.expires_at),
                (record.state, record.expires_at),
            )
        else:
            self._tally.changed(identity, None if before is None else _facts_of(before), _facts_of(record))
        self._reopen(before, record)
        self._index_task(record)
        self._signals.notify(record.identity)

    async def open(self) -> None:
        if self.recovery is None:
            self.recovery = RecoveryReport("memory", 0.0)

    async def aclose(self) -> None:
        self._signals.notify_all()

    async def claim(self, record: CallRecord, now: float) -> tuple[bool, CallRecord]:
        existing = self._calls.get(record.identity)
        if existing is not None and not existing.is_expired(now):
            return False, existing
        self._store(record, existing)
        return True, record

    async def get(self, identity: CallIdentity) -> CallRecord | None:
        return self._calls.get(identity)

    async def swap(self, expected_version: int, record: CallRecord, expected_run_id: str | None = None) -> bool:
        existing = self._calls.get(record.identity)
        if existing is None or existing.version != expected_version:
            return False
        if expected_run_id is not None and existing.run_id != expected_run_id:
            return False
        self._store(record, existing)
        return True

    def _reopen(self, before: CallRecord | None, after: CallRecord | None) -> None:
        """Move a record's identity between the open sets as it changes from `before` to
        `after` (None: no record)."""
        if before is not None and before.state in OPEN_STATES:
            self._open[(before.state, before.task_id is not None)].discard(before.identity)
        if after is not None and after.state in OPEN_STATES:
            self._open[(after.state, after.task_id is not None)].add(after.identity)

    def _drop(self, identity: CallIdentity) -> CallRecord:
        """Remove the record of `identity` (expired; its task and expiry entries are the
        caller's) from the records, the counts and the open sets; return it."""
        record = self._calls.pop(identity)
        self._tally.changed(identity, _facts_of(record), None)
        self._reopen(record, None)
        return record

    def _index_task(self, record: CallRecord) -> None:
        if record.task_id is not None:
            self._tasks[(record.identity.principal, record.task_id)] = record.identity

    async def find_calls(self, tool: str, key: str) -> list[CallRecord]:
        # Only the principals with a record of `tool` are looked up (the counts know them).
        found = [
            record
            for principal, groups in self._tally.counts.by_principal.items()
            if any(group[0] == tool for group in groups)
            and (record := self._calls.get(CallIdentity(str(principal), tool, key))) is not None
        ]
        return sorted(found, key=sort_key, reverse=True)

    async def get_task(self, principal: str, task_id: str) -> CallRecord | None:
        identity = self._tasks.get((principal, task_id))
        record = self._calls.get(identity) if identity is not None else None
        return record if record is not None and record.task_id == task_id else None

    async def renew(self, identity: CallIdentity, fence: Fence, lease_until: float) -> bool:
        existing = self._calls.get(identity)
        if existing is None or not existing.held_by(fence):
            return False
        self._calls[identity] = _with_lease(existing, lease_until)
        return True

    async def append_step(
        self, identity: CallIdentity, fence: Fence, index: int, data: dict[str, Any], ts: float
    ) -> JournalEntry | None:
        data = step_data(index, data)
        existing = self._calls.get(identity)
        if existing is None or not existing.held_by(fence):
            return None
        process_id = step_process_id(fence.run_id)
        if self._steps.get((process_id, index)):
            return None
        # No await since the checks: nothing else ran in between.
        return self._append(process_id, STEP, data, ts)

    async def wait_for_change(self, identity: CallIdentity, timeout: float) -> None:
        await self._signals.wait(identity, timeout)

    async def list_calls(self, query: CallQuery = RECENT_CALLS) -> list[CallRecord]:
        state = query.state
        if state is None or state not in OPEN_STATES:
            return query.page(self._calls.values())
        kinds = (True,) if query.tasks_only else (False, True)
        return query.page(self._calls[i] for task in kinds for i in self._open[(state, task)])

    async def purge_expired(self, now: float) -> int:
        expired = self._tally.take_expired(now)
        for identity in expired:
            self._drop(identity)
        if expired:
            self._tasks = {k: i for k, i in self._tasks.items() if i in self._calls}
        return len(expired)

    async def purge_expired_calls(self, now: float, limit: int = 1000) -> PurgedCalls:
        # Every record expired at `now` at once, as `purge_expired` drops them.
        gone: list[tuple[CallIdentity, str]] = []
        for identity in self._tally.take_expired(now):
            gone.append((identity, self._drop(identity).run_id))
        if not gone:
            return PurgedCalls()
        self._tasks = {k: i for k, i in self._tasks.items() if i in self._calls}
        steps = await self.purge_entries({step_process_id(run_id) for _, run_id in gone})
        return PurgedCalls(tuple(gone), steps)

    async def count_calls(self, query: CountQuery = ALL_CALLS) -> CallCounts:
        return self._tally.count(query, query.principal)

    async def stats(self) -> JournalStats:
        counts = self._tally.count(ALL_CALLS, None)
        return JournalStats(
            backend="memory",
            calls_by_state=counts.by_state,
            calls_by_tool=counts.by_tool,
            entries=len(self._entries) - self._dropped,
            size_bytes=None,
            oldest_record_at=counts.oldest_created_at,
        )

    async def append(self, process_id: str, entry_type: str, data: dict[str, Any], ts: float) -> JournalEntry:
        return self._append(process_id, entry_type, data, ts)

    def _append(self, process_id: str, entry_type: str, data: dict[str, Any], ts: float) -> JournalEntry:
        entry = JournalEntry(process_id, entry_type, data, ts, len(self._entries) + 1)
        self._entries.append(entry)
        if entry_type == CHECKPOINT:
            self._checkpoints[process_id] = entry
        step = step_index(entry_type, data)
        if step is not None:
            key = (process_id, step)
            self._steps[key] = self._steps.get(key, 0) + 1
        audited = audited_call(process_id, entry_type, data)
        if audited is not None:
            self._audits.setdefault(audited, []).append(entry)
        return entry

    async def audit_entries(self, identity: CallIdentity) -> list[JournalEntry]:
        return [e for e in self._audits.get(identity, ()) if self._entries[e.seq - 1] is e]

    async def entries(
        self, *, process_id: str | None = None, after: int = 0, limit: int | None = None
    ) -> list[JournalEntry]:
        # seq == index + 1, so the tail after `after` starts at index `after`.
        selected = [
            e
            for e in self._entries[max(0, after) :]
            if e is not _DROPPED and (process_id is None or e.process_id == process_id)
        ]
        return selected if limit is None else selected[:limit]

    async def last_checkpoint(self, process_id: str) -> JournalEntry | None:
        return self._checkpoints.get(process_id)

    async def purge_entries(self, process_ids: Collection[str], *, before_seq: int | None = None) -> int:
        wanted = set(process_ids)
        dropped = 0
        for i, entry in enumerate(self._entries):
            # Tombstones keep `seq == index + 1`, which `entries(after=…)` relies on.
            if entry is not _DROPPED and entry.process_id in wanted and (before_seq is None or entry.seq < before_seq):
                self._entries[i] = _DROPPED
                self._forget_step(entry)
                if self._checkpoints.get(entry.process_id) is entry:
                    del self._checkpoints[entry.process_id]
                    older = [
                        e for e in self._entries[:i] if e.process_id == entry.process_id and e.entry_type == CHECKPOINT
                    ]
                    if older:
                        self._checkpoints[entry.process_id] = older[-1]
                dropped += 1
        self._dropped += dropped
        return dropped

    def _forget_step(self, entry: JournalEntry) -> None:
        step = step_index(entry.entry_type, entry.data)
        if step is None:
            return
        key = (entry.process_id, step)
        left = self._steps.get(key, 0) - 1
        if left > 0:
            self._steps[key] = left
        else:
            self._steps.pop(key, None)


_DROPPED = JournalEntry("", "dropped", {}, 0.0, 0)


def _facts_of(record: CallRecord) -> Facts:
    i = record.identity
    # The state member itself is the key (a `str` enum hashes and compares as its value):
    # reading `.value` is a Python-level descriptor call, and this runs on every change.
    return (i.principal, i.tool, record.state, record.created_at, record.expires_at)


def _name(key: Hashable) -> str:
    return str(key)


def _state_name(key: Hashable) -> str:
    return CallState(key).value  # the facts' state is always the member (`_facts_of`)


def _with_lease(record: CallRecord, lease_until: float) -> CallRecord:
    # A renewal is not a transition: the version stays, so the owner's pending swap still applies.
    return dataclasses.replace(record, lease_until=lease_until)
