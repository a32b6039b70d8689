"""`FileJournal`: the `Journal` protocol over segment files (see the package docstring)."""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import logging
import math
import os
import time
from bisect import bisect_left
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import parse_qs

import anyio
import anyio.to_thread
import orjson

from ...errors import ConfigError, JournalCorruptError, JournalError
from .. import callers
from ..base import (
    ALL_CALLS,
    AUDIT_PROCESS,
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
from ..fsync import make_dirs
from ..model import CallIdentity, CallRecord, Fence, JournalEntry, JournalStats
from ..record_json import step_data, step_index
from ..tally import TimeRuns
from ..writer_lock import WriterLock
from . import snapshot as snapshots
from . import snapshot_child
from .codec import (
    call_payload,
    entry_from_dict,
    entry_payload,
    identity_hash,
    process_hash,
    purge_payload,
    record_from_dict,
)
from .commit import Batch, GroupCommit
from .framing import HEADER_SIZE, Frame, encode_frame, parse_at
from .index import DEAD, STATE_CODES, CallIndex, EntryIndex, pack, unpack
from .recovery import recover
from .segments import DIR_MODE, FILE_MODE, LOCK, Manifest, ManifestKeeper, segment_name
from .writer import SegmentWriter

if TYPE_CHECKING:
    from .compaction import CompactionReport, PhaseHook

SEGMENT_BYTES = 64 * 1024 * 1024
logger = logging.getLogger(__name__)

#: A snapshot is written once this many frames were appended since the last one (and at close),
#: so recovery after a crash replays at most this tail after loading the snapshot.
SNAPSHOT_EVERY = 100_000
SNAPSHOT_ON_CLOSE = 1_000
#: A snapshot of an index of this many records and entries or more is written by a forked child
#: (`snapshot_child`, where available) instead of from a copy made in the event loop: below it,
#: the copy costs the loop less than the fork.
SNAPSHOT_IN_CHILD_AT = 100_000
#: Seconds a snapshot's child may take before it is killed and the snapshot fails.
SNAPSHOT_CHILD_PATIENCE = 600.0
#: A listing of tasks (not of an open state) sorts the task slots when there are at most this
#: many, and otherwise reads the creation-time runs newest first, skipping what is no task.
TASK_LISTING = 4096


class FileJournal:
    """A crash-safe journal in a directory of append-only segment files; one writer process."""

    single_writer = True

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        durability: str = "strict",
        read_only: bool = False,
        url: str | None = None,
        segment_bytes: int = SEGMENT_BYTES,
    ) -> None:
        if durability not in ("strict", "relaxed"):
            raise ConfigError(f"durability must be strict or relaxed, not {durability!r}")
        self.directory = Path(directory)
        self.url = url or f"file://{self.directory}"
        self.durability = durability
        self.read_only = read_only
        self.segment_bytes = segment_bytes
        self.recovery: RecoveryReport | None = None
        self._signals = ChangeSignals()
        self._maintenance = anyio.Lock()
        self._hash_cache: dict[CallIdentity, int] = {}
        self._process_hashes: dict[str, int] = {}
        self._reset()

    def _reset(self) -> None:
        self._calls = CallIndex()
        self._entries = EntryIndex()
        #: Entries `purge_entries` dropped (indexes into `_entries`): skipped by every read, left
        #: out of the segments (and the index) by the next compaction.
        self._dropped: set[int] = set()
        #: Identity hash → run id of each open record (PENDING, IN_DOUBT) this process wrote, so
        #: that a swap checks the run it expects (`swap`) without reading the record's frame;
        #: nearly every swap is of an open record. Any other record's run is read from its frame.
        #: Every write of a call record goes through `_put`, which keeps this; an entry left for
        #: a record purged meanwhile is never used (no slot) and is replaced by the next claim.
        self._open_runs: dict[int, str] = {}
        self._manifest: Manifest | None = None
        self._keeper: ManifestKeeper | None = None
        self._commit: GroupCommit | None = None
        self._lock: WriterLock | None = None
        self._readers: dict[int, int] = {}
        #: Sizes of sealed segments, by number (`_sealed_bytes`).
        self._segment_sizes: dict[int, int] = {}
        self._writer: SegmentWriter | None = None  # used by one flush at a time
        self._next_seq = 1
        self._active = 1
        self._active_end = 0
        self._since_snapshot = 0
        self._snapshot_outdated = False
        #: The audit entries' seqs by the call they name (`audit_entries`): read from the audit
        #: process once, at the first question after an open, then kept by `append`.
        self._audits: dict[CallIdentity, list[int]] | None = None

    @classmethod
    def from_url(cls, url: str) -> FileJournal:
        """`file://PATH[?durability=strict|relaxed][&mode=rw|ro]`; PATH relative or absolute."""
        path, _, query = url[len("file://") :].partition("?")
        if not path:
            raise ConfigError(f"file journal URL needs a directory: {url!r} (e.g. file://.mcp-durable/journal)")
        params = {k: v[-1] for k, v in parse_qs(query).items()}
        mode = params.get("mode", "rw")
        if mode not in ("rw", "ro"):
            raise ConfigError(f"mode must be rw or ro, not {mode!r}")
        return cls(path, durability=params.get("durability", "strict"), read_only=mode == "ro", url=url)

    # -- lifecycle --------------------------------------------------------------------------------

    async def open(self) -> None:
        if self._manifest is not None:
            return
        started = time.perf_counter()
        try:
            with self._storage_faults(f"cannot open {self.directory}"):
                await anyio.to_thread.run_sync(self._open_sync)
        except BaseException:
            self._close_files()
            self._reset()
            raise
        assert self.recovery is not None
        self.recovery = dataclasses.replace(self.recovery, duration_s=time.perf_counter() - started)
        if not self.read_only and (self._since_snapshot >= SNAPSHOT_EVERY or self._snapshot_outdated):
            # an outdated one: its rebuild is not paid again at the next open
            await self._snapshot_as_cache("the journal is open")

    def _open_sync(self) -> None:
        if self.read_only:
            if not self.directory.is_dir():
                raise JournalError(f"no journal at {self.directory}")
            for _ in range(5):  # a compaction may delete a segment between manifest and read
                try:
                    return self._load(Manifest.read(self.directory))
                except JournalCorruptError:
                    time.sleep(0.05)
            return self._load(Manifest.read(self.directory))
        make_dirs(self.directory, DIR_MODE)  # its entry durable before anything durable is put in it
        os.chmod(self.directory, DIR_MODE)
        self._lock = WriterLock(self.directory / LOCK, str(self.directory))
        self._lock.acquire()
        manifest = Manifest.read(self.directory)
        if manifest is None:
            segments = [p for p in self.directory.iterdir() if p.name.startswith("seg-")]
            if any(p.stat().st_size for p in segments):
                raise JournalCorruptError(str(self.directory / "MANIFEST"), 0, "missing, but segments exist")
            # New (or its creation was cut short: empty segments, no manifest yet). The first
            # segment is created before the manifest that names it, and the manifest's
            # directory fsync makes both names durable: a power loss never leaves a manifest
            # naming a segment that is not there.
            os.close(os.open(self.directory / segment_name(1), os.O_WRONLY | os.O_CREAT, FILE_MODE))
            manifest = Manifest.new()
            manifest.write(self.directory)
        self._keeper = ManifestKeeper(self.directory, manifest)
        self._load(manifest)

    def _load(self, manifest: Manifest | None) -> None:
        if manifest is None:
            raise JournalError(f"no journal at {self.directory} (no MANIFEST)")
        found = recover(self.directory, manifest, writable=not self.read_only)
        self._manifest = manifest
        self._calls, self._entries = found.calls, found.entries
        self._dropped = set()
        self._audits = None
        self._next_seq = found.last_seq + 1
        self._active, self._active_end = found.active, found.active_end
        self._since_snapshot = found.frames_replayed
        self._snapshot_outdated = found.snapshot_outdated
        self._writer = SegmentWriter(self._open_segment)  # opens nothing until the first write
        self._commit = GroupCommit(self._writer, sync=self.durability == "strict", durable_seq=found.last_seq)
        self.recovery = RecoveryReport(
            "file",
            0.0,
            snapshot_used=found.snapshot_used,
            records_loaded=len(found.calls),
            entries_replayed=found.frames_replayed,
            bytes_truncated=found.bytes_truncated,
            truncated_to=found.truncated_to,
            problems=tuple(found.problems),
        )

    async def aclose(self) -> None:
        if self._manifest is None:
            return
        clean = False
        try:
            if self._commit is not None and self._commit.failure is None and not self.read_only:
                await self._commit.wait_seq(self._next_seq - 1)
                if self._since_snapshot >= SNAPSHOT_ON_CLOSE:
                    await self._snapshot_as_cache("the journal closes, every write on disk")
                clean = True
        finally:
            self._close_files(clean=clean)
            self._reset()
            self._signals.notify_all()

    def _close_files(self, *, clean: bool = False) -> None:
        for fd in self._readers.values():
            os.close(fd)
        if self._writer is not None:
            try:
                self._writer.close(trim=clean)  # a clean close leaves no space allocated ahead
            except OSError:
                pass  # the space is given back at the next seal instead; the data is synced
        if self._lock is not None:
            self._lock.release()

    # -- plumbing ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _storage_faults(self, doing: str) -> Iterator[None]:
        """The file journal's one mapping of storage faults: an OS error inside (a full disk, a
        read-only directory, a lost or unreadable file) raises `JournalError`, naming the journal
        and what it was `doing`, with the `OSError` as its cause."""
        try:
            yield
        except OSError as exc:
            raise JournalError(f"journal {self.url}: {doing}: {exc}") from exc

    def _opened(self) -> GroupCommit:
        """The group commit of an open journal (reads wait on it); `JournalError` when not open."""
        if self._commit is None:
            raise JournalError(f"journal {self.url} is not open")
        return self._commit

    def _writable(self) -> GroupCommit:
        commit = self._commit
        if commit is not None and commit.failure is None and not self.read_only:
            return commit  # every write's path: open, writable, no failed flush to heal from
        self._opened()
        if self.read_only:
            raise JournalError(f"journal {self.url} is open read-only")
        self._heal()
        commit = self._opened()
        commit.check()
        return commit

    def _heal(self) -> None:
        """After a failed flush (a full disk, an I/O error), reload the journal from disk in place.

        The in-memory index may name frames that never reached the disk, so it is not trusted:
        the files are closed and recovered exactly as at open (a torn tail cut and kept aside),
        keeping the writer lock. While the cause persists (still no space to keep the torn bytes
        aside, say) this fails and the journal stays refused; once it is gone, the journal works
        again without a restart. Frames of the failed batch that did reach the disk come back
        as what they are: a claim whose caller was refused shows as a dead owner's PENDING
        record and is settled by the in-doubt policy, never silently run twice.
        """
        commit = self._commit
        if commit is None or commit.failure is None or commit.flushing is not None:
            return
        assert self._keeper is not None
        for fd in self._readers.values():
            os.close(fd)
        self._readers = {}
        if self._writer is not None:
            try:
                self._writer.close(trim=False)
            except OSError:
                pass
            self._writer = None
        try:
            self._load(self._keeper.current)
        except (OSError, JournalError) as exc:
            # Still failing: keep the old (failed) commit so every call is refused with its cause.
            self._commit = commit
            raise JournalError(f"journal {self.url} cannot recover from its failed write yet: {exc}") from exc

    def _open_segment(self, segment: int) -> int:
        """A writable descriptor for `segment` (for the flush), creating the segment on first use."""
        assert self._keeper is not None
        if segment not in self._keeper.current.segments:
            self._keeper.add_segment(segment)
        return os.open(self.directory / segment_name(segment), os.O_RDWR)  # read: where its data ends

    def _submit(self, payload: bytes) -> tuple[int, int, int, Batch]:
        """Queue one frame: returns its `(seq, position, size, batch)`. No await: atomic."""
        commit = self._writable()
        seq = self._next_seq
        self._next_seq += 1
        frame = encode_frame(seq, payload)
        if self._active_end and self._active_end + len(frame) > self.segment_bytes:
            self._rotate()
        offset = self._active_end
        self._active_end += len(frame)
        self._since_snapshot += 1
        return seq, pack(self._active, offset), len(frame), commit.add(self._active, offset, frame, seq)

    def _rotate(self) -> None:
        assert self._keeper is not None
        self._active, self._active_end = self._keeper.allocate(), 0

    async def _durable(self, batch: Batch) -> None:
        assert self._commit is not None
        await self._commit.wait(batch)
        if self._since_snapshot >= SNAPSHOT_EVERY and not self._maintenance.locked():
            await self._snapshot_as_cache("the write that started it stands")

    def _hash(self, identity: CallIdentity) -> int:
        h = self._hash_cache.get(identity)
        if h is None:
            assert self._manifest is not None
            if len(self._hash_cache) > 4096:
                self._hash_cache.clear()
            h = self._hash_cache[identity] = identity_hash(self._manifest.hash_key, identity)
        return h

    def _process_hash(self, process_id: str) -> int:
        h = self._process_hashes.get(process_id)
        if h is None:
            if len(self._process_hashes) > 4096:
                self._process_hashes.clear()
            h = self._process_hashes[process_id] = process_hash(process_id)
        return h

    def _read(self, position: int, size: int, *, queued: bool = False) -> dict[str, Any]:
        """Read one frame back (pread), check it, and decode its payload. `queued`: the frame
        may not be on disk yet (its seq is above the durable one), so it is looked for in the
        group commit's batches first (its segment may not even exist yet)."""
        segment, offset = unpack(position)
        in_batch = self._commit.pending(segment, offset) if queued and self._commit is not None else None
        if in_batch is not None:
            buf = in_batch
        else:
            # The one place records are read from disk: a segment that is gone or unreadable is
            # the journal unavailable (JournalError), never an OSError escaping to the caller.
            # (The `storage_faults` context and the path are made only on a fault or the
            # segment's first read: a listing reads hundreds of frames.)
            fd = self._readers.get(segment)
            try:
                if fd is None:
                    fd = self._readers[segment] = os.open(self.directory / segment_name(segment), os.O_RDONLY)
                buf = os.pread(fd, size, offset)
            except OSError as exc:
                raise JournalError(f"journal {self.url}: cannot read {segment_name(segment)}: {exc}") from exc
        frame = parse_at(buf, 0, len(buf))
        if not isinstance(frame, Frame) and self._commit is not None:
            # Queued but not written yet (a reader that did not wait for this frame): its bytes are
            # still in the group commit's batch.
            late = self._commit.pending(segment, offset)
            if late is not None:
                buf = late
                frame = parse_at(buf, 0, len(buf))
        if not isinstance(frame, Frame):
            raise JournalCorruptError(str(self.directory / segment_name(segment)), offset, frame)
        try:
            result: dict[str, Any] = orjson.loads(buf[HEADER_SIZE : HEADER_SIZE + frame.length])
        except orjson.JSONDecodeError as exc:
            path = self.directory / segment_name(segment)
            raise JournalCorruptError(str(path), offset, f"the frame's payload is not JSON: {exc}") from exc
        return result

    async def _load_call(self, identity: CallIdentity | None, h: int) -> tuple[int, CallRecord] | None:
        """The durable latest record of `identity` with its frame's position, or None (`identity`
        None: of whatever identity has the index's hash `h`; the caller compares)."""
        if not self.read_only:
            try:
                self._heal()
            except JournalError:
                # Not recovered from a failed write yet: what is on disk can still be read, so an
                # acknowledged result is still replayed during a disk fault. A frame at or below
                # the durable seq is on disk whatever failed after it; a record whose latest frame
                # was in the failed flush is refused below (wait_seq raises the failure).
                pass
        commit = self._commit
        if commit is None:
            raise JournalError(f"journal {self.url} is not open")
        while True:
            slot = self._calls.find(h)
            if slot is None:
                return None
            seq = self._calls.queued_seq(slot)
            if seq > commit.durable_seq:  # never answer with a record that is not on disk yet
                await commit.wait_seq(seq)
                continue
            position = self._calls.position(slot)
            record = record_from_dict(self._read(position, self._calls.size[slot])["r"])
            if identity is not None and record.identity != identity:
                raise JournalError(f"index hash collision between {identity} and {record.identity}")
            return position, record

    def _put(self, h: int, record: CallRecord) -> Batch:
        if record.state in OPEN_STATES:
            self._open_runs[h] = record.run_id
        else:
            self._open_runs.pop(h, None)
        seq, position, size, batch = self._submit(call_payload(record))
        calls = self._calls
        slot = calls.put(h, record, position, size)
        calls.queue(slot, seq, self._opened().durable_seq)
        if record.task_id is not None:
            calls.put_task(record.task_id, h, record.identity.principal)
        self._signals.notify(record.identity)
        return batch

    # -- call records -----------------------------------------------------------------------------

    async def claim(self, record: CallRecord, now: float) -> tuple[bool, CallRecord]:
        self._writable()
        h = self._hash(record.identity)
        while True:
            slot = self._calls.find(h)
            if slot is None or self._calls.expires[slot] <= now:
                break
            found = await self._load_call(record.identity, h)
            if found is not None and not found[1].is_expired(now):
                return False, found[1]
        await self._durable(self._put(h, record))
        return True, record

    async def get(self, identity: CallIdentity) -> CallRecord | None:
        found = await self._load_call(identity, self._hash(identity))
        return None if found is None else found[1]

    async def find_calls(self, tool: str, key: str) -> list[CallRecord]:
        # The principals with a record of `tool` (the tally's counts know them), each looked up
        # by its identity hash: no slot of another call is visited.
        idx = self._calls
        tool_id = idx.tools.ids.get(tool)
        if tool_id is None:
            return []
        principals = [
            idx.principals.names[cast(int, principal)]
            for principal, groups in idx.tally.counts.by_principal.items()
            if any(group[0] == tool_id for group in groups)
        ]
        found = [record for p in principals if (record := await self.get(CallIdentity(p, tool, key))) is not None]
        return sorted(found, key=sort_key, reverse=True)

    async def get_task(self, principal: str, task_id: str) -> CallRecord | None:
        h = self._calls.task_hash(principal, task_id)
        found = None if h is None else await self._load_call(None, h)
        if found is None or found[1].identity.principal != principal or found[1].task_id != task_id:
            return None
        return found[1]

    async def swap(self, expected_version: int, record: CallRecord, expected_run_id: str | None = None) -> bool:
        self._writable()
        h = self._hash(record.identity)
        slot = self._calls.find(h)
        if slot is None or self._calls.version[slot] != expected_version:
            return False
        if expected_run_id is not None and self._open_runs.get(h) != expected_run_id:
            if h in self._open_runs:
                return False  # an open record of another run
            stored = await self._latest(record.identity, h)
            if stored is None or stored.version != expected_version or stored.run_id != expected_run_id:
                return False
        await self._durable(self._put(h, record))
        return True

    async def renew(self, identity: CallIdentity, fence: Fence, lease_until: float) -> bool:
        self._writable()
        h = self._hash(identity)
        found = await self._held(identity, h, fence)
        if found is None:
            return False
        # A renewal is not a transition: the version stays, so the owner's pending swap still applies.
        await self._durable(self._put(h, dataclasses.replace(found, lease_until=lease_until)))
        return True

    async def append_step(
        self, identity: CallIdentity, fence: Fence, index: int, data: dict[str, Any], ts: float
    ) -> JournalEntry | None:
        self._writable()
        data = step_data(index, data)
        process_id = step_process_id(fence.run_id)
        if await self._held(identity, self._hash(identity), fence) is None:
            return None
        # From the fence check to the frame's queueing below, no await: no swap, renewal or step
        # of another task comes in between, so the step lands before any take-over's frame.
        phash = self._process_hash(process_id)
        if self._has_step(phash, process_id, index):
            # Answered only once that step is on disk: a step whose flush fails is no step.
            await self._opened().wait_seq(self._next_seq - 1)
            return None
        seq, position, size, batch = self._submit(entry_payload(process_id, STEP, data, ts))
        self._entries.add(seq, position, size, phash, False, index)
        await self._durable(batch)
        return JournalEntry(process_id, STEP, data, ts, seq)

    async def _held(self, identity: CallIdentity, h: int, fence: Fence) -> CallRecord | None:
        """The stored record of `identity` if it is PENDING under `fence`, else None; when it
        is, it is still the latest on return (the caller writes before its next await)."""
        record = await self._latest(identity, h)
        return record if record is not None and record.held_by(fence) else None

    async def _latest(self, identity: CallIdentity, h: int) -> CallRecord | None:
        """The stored record of `identity` (None: none), read from its frame and still the
        latest on return: the caller that writes before its next await writes over this one."""
        while True:
            found = await self._load_call(identity, h)
            if found is None:
                return None
            slot = self._calls.find(h)
            # Unchanged while we read it: a new frame is never where an earlier one was.
            if slot is not None and self._calls.position(slot) == found[0]:
                return found[1]

    def _has_step(self, phash: int, process_id: str, index: int) -> bool:
        """Whether step `index` of `process_id` is stored (not dropped). One dict lookup when it
        is not; otherwise the process's entries are read (process hashes may collide)."""
        e, durable = self._entries, self._opened().durable_seq
        if not e.may_have_step(phash, index):
            return False
        for i in e.chain(phash, 0):
            if i in self._dropped:
                continue
            d = self._read(e.pos[i], e.size[i], queued=e.seq[i] > durable)
            if d["process_id"] == process_id and step_index(d["entry_type"], d["data"]) == index:
                return True
        return False

    async def wait_for_change(self, identity: CallIdentity, timeout: float) -> None:
        await self._signals.wait(identity, timeout)

    async def list_calls(self, query: CallQuery = RECENT_CALLS) -> list[CallRecord]:
        await self._opened().wait_seq(self._next_seq - 1)  # then read without yielding: one consistent view
        # The index narrows by state, tool, principal, task and time without reading a frame;
        # `query.matches` decides on the records read (the cursor's tie-break by identity).
        idx = self._calls
        if query.limit <= 0:
            return []
        tool_id = idx.tools.ids.get(query.tool, -1) if query.tool is not None else None
        principal_id = idx.principals.ids.get(query.principal, -1) if query.principal is not None else None
        if tool_id == -1 or principal_id == -1:
            return []  # no record of that tool or principal
        code = STATE_CODES[query.state] if query.state is not None else None
        top = query.cursor.created_at if query.cursor is not None else math.inf
        tasks = idx.task_hashes if query.tasks_only else None
        candidates: Iterable[tuple[float, int]]
        if (query.state is not None and query.state in OPEN_STATES) or (
            tasks is not None and len(tasks) <= TASK_LISTING
        ):
            # An open state, or the tasks when they are few, from their own slot sets
            # (`listing_slots`): those slots only, sorted.
            found = [(idx.created[s], s) for s in idx.listing_slots(query.state, query.tasks_only)]
            candidates = sorted(((t, s) for t, s in found if t <= top), reverse=True)
        else:
            # Otherwise the tally's creation-time runs of the principal and tool asked for
            # (every one when not asked), merged newest first and read only as far as the page
            # needs: one page costs about its length (over the filters' selectivity), whatever
            # the journal's size.
            candidates = idx.tally.newest(principal_id, tool_id, top)
        state, hash_of = idx.state, idx.hash_of
        out: list[CallRecord] = []
        group: list[int] = []
        group_time = math.nan
        for created, s in candidates:
            if created != group_time:
                if group:  # a group of one creation time is read whole: the tie-break needs it
                    self._list_group(group, query, out)
                    group = []
                    if len(out) >= query.limit:
                        break
                group_time = created
            if (
                state[s] != DEAD
                and (code is None or state[s] == code)
                and (tool_id is None or idx.tool[s] == tool_id)
                and (principal_id is None or idx.principal[s] == principal_id)
                and (tasks is None or hash_of(s) in tasks)
            ):
                group.append(s)
        else:
            if group:
                self._list_group(group, query, out)
        return out[: query.limit]

    def _list_group(self, slots: list[int], query: CallQuery, out: list[CallRecord]) -> None:
        """Read the records in `slots` (one creation time), add those `query` selects to `out`
        in listing order."""
        idx = self._calls
        group = [record_from_dict(self._read(idx.position(s), idx.size[s])["r"]) for s in slots]
        out.extend(sorted(filter(query.matches, group), key=sort_key, reverse=True))

    async def purge_expired(self, now: float) -> int:
        self._writable()
        slots = self._calls.take_expired(now)
        if not slots:
            return 0
        _, _, _, batch = self._submit(purge_payload(now))
        for slot in slots:
            self._calls.delete(slot)
        self._calls.prune_tasks()
        await self._durable(batch)
        return len(slots)

    async def purge_expired_calls(self, now: float, limit: int = 1000) -> PurgedCalls:
        # A page: the `limit` earliest expiries (and any that tie with the last), as every record
        # expired at the page's cutoff, so that one `purge` frame at the cutoff stands for them
        # all (and replays so). Their runs are read from their frames first, without an await
        # between the expiry index and the frame, so the frame drops exactly these. A page holds
        # the event loop while it reads and deletes (all of it, when every expired record went
        # at once: seconds for 10^4 of them, every call of the process waiting), so retention
        # asks for pages it can afford (operations/retention.py).
        self._writable()
        idx, durable = self._calls, self._opened().durable_seq
        cutoff = _page_cutoff(idx.tally.expiry, now, max(1, limit))
        slots = idx.take_expired(cutoff)
        if not slots:
            return PurgedCalls()
        try:
            gone = []
            tasks = False
            for slot in slots:
                r = record_from_dict(
                    self._read(idx.position(slot), idx.size[slot], queued=idx.queued_seq(slot) > durable)["r"]
                )
                gone.append((r.identity, r.run_id))
                tasks = tasks or r.task_id is not None
        except BaseException:
            for slot in slots:  # not dropped: back in the expiry index for the next attempt
                idx.tally.expiry.add(idx.expires[slot], slot)
            raise
        _, _, _, batch = self._submit(purge_payload(cutoff))
        for slot in slots:
            idx.delete(slot)
        if tasks:  # it walks every task of the journal: only when one of these was a task
            idx.prune_tasks()
        steps = await self.purge_entries({step_process_id(run_id) for _, run_id in gone})
        await self._durable(batch)
        return PurgedCalls(tuple(gone), steps)

    async def count_calls(self, query: CountQuery = ALL_CALLS) -> CallCounts:
        self._opened()
        idx = self._calls
        principal = idx.principals.ids.get(query.principal) if query.principal is not None else None
        return idx.tally.count(query, principal, known=query.principal is None or principal is not None)

    async def stats(self) -> JournalStats:
        self._opened()
        counts = self._calls.tally.count(ALL_CALLS, None)
        if self._keeper is not None:
            size = self._active_end + self._sealed_bytes()
        else:  # read-only: another process writes, rotates and compacts; its files as they are
            size = 0
            for p in self.directory.glob("seg-*.log"):
                with self._storage_faults(f"cannot read {p.name}"):
                    try:
                        size += p.stat().st_size
                    except FileNotFoundError:  # removed by a compaction since the listing
                        continue
        entries = len(self._entries) - len(self._dropped)
        return JournalStats("file", counts.by_state, counts.by_tool, entries, size, counts.oldest_created_at)

    def _sealed_bytes(self) -> int:
        """Bytes of the segments other than the active one. A sealed segment is never written
        again once the writer has moved past it (trimmed to its data then), so its size is
        read once and kept: the journal's size costs a dict lookup per segment, not a `stat`."""
        assert self._keeper is not None
        writing = self._writer.segment if self._writer is not None else None
        sizes, total = self._segment_sizes, 0
        segments = self._keeper.current.segments
        for segment in segments:
            if segment == self._active:
                continue
            size = sizes.get(segment)
            if size is None:
                path = self.directory / segment_name(segment)
                with self._storage_faults(f"cannot read {path.name}"):
                    try:
                        size = path.stat().st_size
                    except FileNotFoundError:  # removed by a compaction meanwhile
                        continue
                if segment != writing:
                    sizes[segment] = size
            total += size
        if len(sizes) > len(segments):
            self._segment_sizes = {n: b for n, b in sizes.items() if n in segments}
        return total

    def live_bytes(self) -> tuple[int, int]:
        """`(bytes in segments, bytes of live frames)`: the rest is garbage a compaction reclaims."""
        # Kept sizes (the index's): reading every slot here cost a pass over the journal per
        # retention pass; only the entries dropped since the last compaction are summed.
        e = self._entries
        live = self._calls.live_size() + e.total_size() - sum(e.size[i] for i in self._dropped)
        # The active segment counts up to its data: the space allocated ahead of it is not garbage.
        if self._keeper is not None:
            return self._active_end + self._sealed_bytes(), live
        total = self._active_end + sum(
            p.stat().st_size for p in self.directory.glob("seg-*.log") if p.name != segment_name(self._active)
        )
        return total, live

    async def purge_entries(self, process_ids: Collection[str], *, before_seq: int | None = None) -> int:
        self._writable()
        e, durable = self._entries, self._opened().durable_seq
        dropped = 0
        for process_id in set(process_ids):
            phash = self._process_hash(process_id)
            for i in e.chain(phash, 0):
                if i in self._dropped or (before_seq is not None and e.seq[i] >= before_seq):
                    continue
                d = self._read(e.pos[i], e.size[i], queued=e.seq[i] > durable)
                if d["process_id"] == process_id:  # hashes may collide
                    self._dropped.add(i)
                    dropped += 1
                    step = step_index(d["entry_type"], d["data"])
                    if step is not None:
                        e.forget_step(phash, step)
        return dropped

    # -- process entries --------------------------------------------------------------------------

    async def append(self, process_id: str, entry_type: str, data: dict[str, Any], ts: float) -> JournalEntry:
        payload = entry_payload(process_id, entry_type, data, ts)
        seq, position, size, batch = self._submit(payload)
        self._entries.add(
            seq, position, size, self._process_hash(process_id), entry_type == CHECKPOINT, step_index(entry_type, data)
        )
        if self._audits is not None and (audited := audited_call(process_id, entry_type, data)) is not None:
            self._audits.setdefault(audited, []).append(seq)
        counted = callers.direct_write()  # a writer appending in a loop need not wait for others
        try:
            await self._durable(batch)
        finally:
            callers.direct_done(counted)
        return JournalEntry(process_id, entry_type, data, ts, seq)

    async def entries(
        self, *, process_id: str | None = None, after: int = 0, limit: int | None = None
    ) -> list[JournalEntry]:
        await self._opened().wait_seq(self._next_seq - 1)
        e = self._entries
        if process_id is None:
            stop = len(e) if limit is None or self._dropped else min(len(e), e.first_after(after) + max(0, limit))
            indexes: list[int] | range = range(e.first_after(after), stop)
        else:
            indexes = e.chain(self._process_hash(process_id), after)
        out: list[JournalEntry] = []
        dropped = self._dropped
        for i in indexes:
            if limit is not None and len(out) >= limit:
                break
            if i in dropped:
                continue
            d = self._read(e.pos[i], e.size[i])
            if process_id is None or d["process_id"] == process_id:
                out.append(entry_from_dict(d, e.seq[i]))
        return out

    async def audit_entries(self, identity: CallIdentity) -> list[JournalEntry]:
        await self._opened().wait_seq(self._next_seq - 1)  # then read without yielding
        if self._audits is None:
            self._audits = self._index_audits()
        e, out = self._entries, list[JournalEntry]()
        for seq in self._audits.get(identity, ()):
            i = bisect_left(e.seq, seq)
            if i == len(e) or e.seq[i] != seq or i in self._dropped:
                continue  # dropped (and, after a compaction, gone from the index)
            d = self._read(e.pos[i], e.size[i])
            if (
                d["process_id"] == AUDIT_PROCESS
                and audited_call(d["process_id"], d["entry_type"], d["data"]) == identity
            ):
                out.append(entry_from_dict(d, seq))
        return out

    def _index_audits(self) -> dict[CallIdentity, list[int]]:
        """The audit entries' seqs by call, read from the audit process's frames (its chain only)."""
        e, audits = self._entries, dict[CallIdentity, list[int]]()
        for i in e.chain(self._process_hash(AUDIT_PROCESS), 0):
            if i in self._dropped:
                continue
            d = self._read(e.pos[i], e.size[i])
            audited = audited_call(d["process_id"], d["entry_type"], d["data"])
            if audited is not None:
                audits.setdefault(audited, []).append(e.seq[i])
        return audits

    async def last_checkpoint(self, process_id: str) -> JournalEntry | None:
        await self._opened().wait_seq(self._next_seq - 1)
        e, phash = self._entries, self._process_hash(process_id)
        i = e.checkpoint.get(phash)
        if (
            i is not None
            and i not in self._dropped
            and (d := self._read(e.pos[i], e.size[i]))["process_id"] == process_id
        ):
            return entry_from_dict(d, e.seq[i])
        for i in reversed(e.chain(phash, 0)):  # two process ids share a hash: look at each entry
            if i in self._dropped:
                continue
            d = self._read(e.pos[i], e.size[i])
            if d["process_id"] == process_id and d["entry_type"] == CHECKPOINT:
                return entry_from_dict(d, e.seq[i])
        return None

    # -- maintenance ------------------------------------------------------------------------------

    async def snapshot(self) -> str | None:
        """Write a snapshot of the index now; returns its file name (None when read-only)."""
        commit = self._writable() if not self.read_only else None
        if commit is None or self._keeper is None:
            return None
        async with self._maintenance:
            with self._storage_faults("cannot write a snapshot"), self.writing_big_file():
                seq = self._next_seq - 1
                segments = tuple(s for s in self._keeper.current.segments if s != self._active) + (self._active,)
                tmp = await self._write_snapshot(seq, segments)
                await commit.wait_seq(seq)  # the snapshot may only cover frames that are on disk
                path = await anyio.to_thread.run_sync(snapshots.publish, tmp)
                return path.name

    @contextlib.contextmanager
    def writing_big_file(self) -> Iterator[None]:
        """Around writing a whole file beside the segments (a snapshot, a compaction's copy):
        the group commit flushes in a thread meanwhile (`GroupCommit.big_writes`)."""
        commit = self._commit
        if commit is None:
            yield
            return
        commit.big_writes += 1
        try:
            yield
        finally:
            commit.big_writes -= 1

    async def _snapshot_as_cache(self, meanwhile: str) -> None:
        """A snapshot the journal takes on its own (at open, every `SNAPSHOT_EVERY` frames, at
        close). A snapshot is a cache: one that fails (a disk too full for it, say) costs the
        next open a longer replay, so it is logged and the open, the write or the close that
        started it goes on; an operator's `snapshot()` raises instead."""
        try:
            await self.snapshot()
        except JournalError as exc:
            logger.warning("%s; %s", exc, meanwhile)

    async def _write_snapshot(self, seq: int, segments: tuple[int, ...]) -> Path:
        """Write the index as it is now into a temp file (`snapshots.write_temp`).

        A large index is written by a forked child (`snapshot_child`): the loop pays a fork,
        not a copy of every array, and the process does not hold the index twice meanwhile.
        A small one, or one where no child can be forked, is copied here and written by a
        worker thread. Either way the image is the index at this call's first line: nothing
        before the fork or the copy awaits."""
        child = None
        if len(self._calls) + len(self._entries) >= SNAPSHOT_IN_CHILD_AT:
            child = snapshot_child.start(self.directory, self._calls, self._entries, seq, segments, self._active_end)
        if child is None:
            data = snapshots.capture(self._calls, self._entries, seq, segments, self._active_end)
            self._since_snapshot = 0
            return await anyio.to_thread.run_sync(snapshots.write_temp, self.directory, data)
        self._since_snapshot = 0
        return await anyio.to_thread.run_sync(snapshot_child.wait, child, SNAPSHOT_CHILD_PATIENCE)

    async def compact(self, now: float, *, at_phase: PhaseHook | None = None) -> CompactionReport:
        """Drop expired records and superseded versions by rewriting the sealed segments.
        `at_phase(name)` is called after each durable step (crash tests kill the process there)."""
        from .compaction import compact

        with self._storage_faults("compaction"):
            return await compact(self, now, at_phase=at_phase)

    # -- what compaction needs (`compaction.CompactionTarget`) --------------------------------------

    @property
    def maintenance(self) -> anyio.Lock:
        """Held by one snapshot or compaction at a time."""
        return self._maintenance

    async def seal(self) -> tuple[tuple[int, ...], int]:
        """Start a new active segment and wait until every frame before it is on disk; the
        sealed segments (never written again) and a fresh segment number to compact them into."""
        commit = self._writable()
        assert self._keeper is not None
        self._rotate()
        await commit.wait_seq(self._next_seq - 1)
        return tuple(s for s in self._keeper.current.segments if s != self._active), self._keeper.allocate()

    def live_frames(self, segments: tuple[int, ...]) -> tuple[list[tuple[int, int, int]], set[int]]:
        """The frames of `segments` still in use, in log order, as `(position, size, ref)` (`ref`:
        a call's slot, or `~i` for entry `i`), and the entries dropped so far (left out)."""
        order = {segment: i for i, segment in enumerate(segments)}
        calls, entries = self._calls, self._entries
        items: list[tuple[int, int, int]] = []
        for slot in range(len(calls.state)):
            if calls.state[slot] != DEAD and calls.segment[slot] in order:
                items.append((calls.position(slot), calls.size[slot], slot))
        dropped = set(self._dropped)
        for i in range(len(entries)):
            if i not in dropped and unpack(entries.pos[i])[0] in order:
                items.append((entries.pos[i], entries.size[i], ~i))
        items.sort(key=lambda item: (order[unpack(item[0])[0]], unpack(item[0])[1]))
        return items, dropped

    async def switch(self, sealed: tuple[int, ...], target: int) -> int:
        """Replace `sealed` with `target` in the manifest (one atomic rename); segments after it."""
        assert self._keeper is not None
        await anyio.to_thread.run_sync(self._keeper.replace_segments, sealed, target, self._next_seq)
        return len(self._keeper.current.segments)

    def relocate(
        self, items: list[tuple[int, int, int]], offsets: list[int], target: int, dropped: set[int]
    ) -> tuple[int, int]:
        """Point the index at the copies of `items` (at `offsets` of `target`), leave out the
        entries `dropped` before the copy, and close readers of the segments gone; the records and
        entries kept. Runs without an await: what writers did meanwhile is kept, in order."""
        calls, entries = self._calls, self._entries
        kept_records = kept_entries = 0
        for (position, _, ref), offset in zip(items, offsets, strict=True):
            if ref >= 0:
                if calls.position(ref) == position:  # unchanged during the copy
                    calls.set_position(ref, pack(target, offset))
                kept_records += 1
            else:
                entries.pos[~ref] = pack(target, offset)
                kept_entries += 1
        if dropped:
            late = self._dropped - dropped  # dropped during the copy: renumbered like the index
            self._entries = entries.without(dropped)
            order_dropped = sorted(dropped)
            self._dropped = {i - bisect_left(order_dropped, i) for i in late}
        live = set(self._keeper.current.segments) if self._keeper is not None else set()
        for segment in [s for s in self._readers if s not in live]:
            os.close(self._readers.pop(segment))
        return kept_records, kept_entries


def _page_cutoff(expiry: TimeRuns[int], now: float, limit: int) -> float:
    """The expiry time of the `limit`-th earliest record expired at `now` (`now` when fewer
    have): whole runs of the expiry index are read, oldest first, until they hold `limit`, so
    every record expiring at or before the answer is among those read."""
    times: list[float] = []
    for i in range(len(expiry.starts)):
        if expiry.starts[i] > now:
            break
        times.extend(t for _, t in expiry.live(i) if t <= now)
        if len(times) >= limit:
            return heapq.nsmallest(limit, times)[-1]
    return now
