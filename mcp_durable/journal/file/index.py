"""The in-memory index: where the latest frame of every record is, in a few flat arrays.

Memory is the constraint (a million records must load in well under 300 MB), so nothing here is
an object per record. A call record is a *slot*: one position in parallel `array`s (its hash,
frame position and size, sequence number, version, state, times, interned tool and principal),
about 65 bytes, plus 4 to 12 bytes of an open-addressing table from the identity's 128-bit hash
to its slot (an array too, saved in snapshots as it is). Results and arguments stay on disk: a
`get()` reads the frame back.

Counts by (principal, tool, state) and the slots by creation time (per principal) and by expiry
time are kept beside the arrays (`tally.RecordTally`, about 4 bytes per record and time), so
`count_calls`, `stats` and purges read what they count or drop, never every slot. So are the
slots of the PENDING and IN_DOUBT records (`CallIndex.open`, sets by state, rebuilt from the
state array when a snapshot is loaded), so a listing of those states (the sweep, the task
watch, recovery, the in-doubt listings) reads those slots only.

Process entries are likewise arrays (sequence number, position, size, previous entry of the same
process, process hash), with per-process chains so `entries(process_id=…)` and
`last_checkpoint()` read only that process's frames, and a count of the durable steps stored per
`(process hash, step index)` (`EntryIndex.steps`), so `append_step` knows in one dict lookup
that a step is new.
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_right
from collections.abc import Collection, Hashable
from typing import Any, ClassVar, cast

from ..base import OPEN_STATES
from ..model import CallRecord, CallState
from ..tally import Facts, RecordTally

MASK64 = (1 << 64) - 1
SEGMENT_SHIFT = 40  # a position is segment number << 40 | byte offset (segments stay < 1 TiB)
NO_EXPIRY = float("inf")
DEAD = 0
EMPTY = -1
DELETED = -2
MIN_TABLE = 1024
STATE_CODES = {
    CallState.PENDING: 1,
    CallState.COMPLETED: 2,
    CallState.FAILED: 3,
    CallState.IN_DOUBT: 4,
    CallState.RELEASED: 5,
}
CODE_STATES: dict[int, CallState] = {code: state for state, code in STATE_CODES.items()}
_STATE_NAMES = {code: state.value for code, state in CODE_STATES.items()}
#: The codes of the open states (`base.OPEN_STATES`), whose slots `CallIndex.open` keeps.
OPEN_CODES = frozenset(STATE_CODES[state] for state in OPEN_STATES)


def pack(segment: int, offset: int) -> int:
    return segment << SEGMENT_SHIFT | offset


def unpack(position: int) -> tuple[int, int]:
    return position >> SEGMENT_SHIFT, position & ((1 << SEGMENT_SHIFT) - 1)


class Interned:
    """Strings (tools, principals) numbered in order of first sight."""

    def __init__(self, names: list[str] | None = None) -> None:
        self.names: list[str] = list(names or [])
        self.ids: dict[str, int] = {name: i for i, name in enumerate(self.names)}

    def id(self, name: str) -> int:
        found = self.ids.get(name)
        if found is None:
            found = self.ids[name] = len(self.names)
            self.names.append(name)
        return found


class Columns:
    """A struct of arrays: one `array` attribute per `(name, typecode)` of `ARRAYS`, created
    empty. `ARRAYS` is also what the snapshot saves and loads, so a column's typecode is
    stated once."""

    ARRAYS: ClassVar[tuple[tuple[str, str], ...]] = ()

    def __init__(self) -> None:
        for name, code in self.ARRAYS:
            setattr(self, name, array(code))


class CallIndex(Columns):
    """Call records by identity hash: slot arrays plus an open-addressing table of slots.

    `table` (an `array("i")`, a power of two long, at most 70 % used) maps a hash to its slot by
    linear probing from its low bits; `-1` is an empty bucket, `-2` one whose slot was deleted.
    Probes compare the whole 128-bit hash (`lo`, `hi`), so there is no collision to handle, and
    the table is saved in the snapshot as it is: loading a million records builds nothing.
    """

    ARRAYS = (
        ("lo", "Q"),
        ("hi", "Q"),
        ("pos", "Q"),
        ("size", "I"),
        ("seq", "Q"),
        ("version", "Q"),
        ("created", "d"),
        ("expires", "d"),
        ("tool", "I"),
        ("principal", "I"),
        ("table", "i"),
    )

    lo: array[int]
    hi: array[int]
    pos: array[int]
    size: array[int]
    seq: array[int]
    version: array[int]
    created: array[float]
    expires: array[float]
    tool: array[int]
    principal: array[int]
    table: array[int]

    def __init__(self) -> None:
        super().__init__()
        self.table = array("i", [EMPTY]) * MIN_TABLE
        self.state = bytearray()
        self.tools = Interned()
        self.principals = Interned()
        #: Dead slots, the next one to use last (popped).
        self.free = array("I")
        #: (principal, task id) → (identity hash, tool, key) of the record that is that task. Tasks
        #: are few next to calls, so a dict; saved in the snapshot header. Entries of purged
        #: records are dropped by `prune_tasks`; a stale one is harmless (reads compare the task id).
        self.tasks: dict[tuple[str, str], tuple[int, str, str]] = {}
        #: The identity hashes among `tasks`' values: a record whose hash is not here is no task
        #: (one that is here may be no task any more: readers compare the record's task id).
        self.task_hashes: set[int] = set()
        #: The slots of the records in each open state (`OPEN_CODES`), kept by `put_fields` and
        #: `delete`; not saved in snapshots (`after_load` finds them in `state`).
        self.open: dict[int, set[int]] = {code: set() for code in OPEN_CODES}
        self.live = 0
        self.used = 0  # buckets not EMPTY (live and deleted)
        self._live_size: int | None = 0  # bytes of the live records' frames (None: to be summed)
        self.tally: RecordTally[int] = RecordTally(
            self.facts, _slots, (self._principal_name, self._tool_name, _state_name)
        )

    def facts(self, slot: int) -> Facts | None:
        """What the tally indexes of the record in `slot` (None: no record there; `NO_EXPIRY`, an
        infinite expiry, for a record that never expires)."""
        if slot >= len(self.state) or self.state[slot] == DEAD:
            return None
        return (self.principal[slot], self.tool[slot], self.state[slot], self.created[slot], self.expires[slot])

    def _principal_name(self, principal: Hashable) -> str:
        return self.principals.names[cast(int, principal)]

    def _tool_name(self, tool: Hashable) -> str:
        return self.tools.names[cast(int, tool)]

    def __len__(self) -> int:
        """Live records."""
        return self.live

    def _bucket(self, lo: int, hi: int) -> int:
        """The bucket holding (lo, hi), or -1 - the first free bucket on its probe path."""
        table, los, his = self.table, self.lo, self.hi
        mask = len(table) - 1
        i = lo & mask
        free = -1
        while True:
            slot = table[i]
            if slot == EMPTY:
                return -1 - (i if free < 0 else free)
            if slot == DELETED:
                if free < 0:
                    free = i
            elif los[slot] == lo and his[slot] == hi:
                return i
            i = (i + 1) & mask

    def find(self, h: int) -> int | None:
        bucket = self._bucket(h & MASK64, h >> 64)
        return self.table[bucket] if bucket >= 0 else None

    def put(self, h: int, record: CallRecord, position: int, size: int, seq: int) -> int:
        """Point the identity `h` at its latest frame; returns its slot."""
        return self.put_fields(
            h,
            record.version,
            STATE_CODES[record.state],
            record.created_at,
            record.expires_at,
            record.identity.tool,
            record.identity.principal,
            position,
            size,
            seq,
        )

    def put_fields(
        self,
        h: int,
        version: int,
        state: int,
        created: float,
        expires: float | None,
        tool: str,
        principal: str,
        position: int,
        size: int,
        seq: int,
    ) -> int:
        lo, hi = h & MASK64, h >> 64
        bucket = self._bucket(lo, hi)
        if bucket < 0 and (self.used + 1) * 10 > len(self.table) * 7:
            self.rehash()  # before the new slot exists, so the rebuilt table has room for it
            bucket = self._bucket(lo, hi)
        slot = self.table[bucket] if bucket >= 0 else self._new_slot(lo, hi, -1 - bucket)
        before = self.facts(slot) if bucket >= 0 else None
        if self._live_size is not None:
            self._live_size += size - (self.size[slot] if bucket >= 0 else 0)
        self.pos[slot] = position
        self.size[slot] = size
        self.seq[slot] = seq
        self.version[slot] = version
        self.state[slot] = state
        self.created[slot] = created
        self.expires[slot] = NO_EXPIRY if expires is None else expires
        self.tool[slot] = self.tools.id(tool)
        self.principal[slot] = self.principals.id(principal)
        self.tally.changed(slot, before, self.facts(slot))
        was = DEAD if before is None else cast(int, before[2])
        if was != state:
            self._reopen(slot, was, state)
        return slot

    def _reopen(self, slot: int, was: int, now: int) -> None:
        """Move `slot` between the open sets as its state code changes from `was` to `now`."""
        if was in OPEN_CODES:
            self.open[was].discard(slot)
        if now in OPEN_CODES:
            self.open[now].add(slot)

    def listing_slots(self, state: CallState | None, tasks_only: bool) -> Collection[int]:
        """The slots a listing of `state` (None: any) looks at, of tasks only with `tasks_only`:
        a superset of those it selects (dead slots among them: callers skip those). An open
        state (`OPEN_STATES`) is read from its set, a listing of tasks from `task_hashes`:
        neither walks every slot, and with no such record nothing is read. Any other listing
        walks every slot."""
        if state is not None and state in OPEN_STATES:
            slots = self.open[STATE_CODES[state]]
            if not tasks_only:
                return slots
            tasks = self.task_hashes
            return [s for s in slots if self.hash_of(s) in tasks] if tasks and slots else ()
        if tasks_only:
            return {s for h in self.task_hashes if (s := self.find(h)) is not None}
        return range(len(self.state))

    def put_task(self, task_id: str | None, h: int, principal: str, tool: str, key: str) -> None:
        if task_id is not None:
            self.tasks[(principal, task_id)] = (h, tool, key)
            self.task_hashes.add(h)

    def prune_tasks(self) -> None:
        """Forget tasks whose record is gone (after a purge)."""
        if self.tasks:
            self.tasks = {k: v for k, v in self.tasks.items() if self.find(v[0]) is not None}
            self.task_hashes = {h for h, _, _ in self.tasks.values()}

    def hash_of(self, slot: int) -> int:
        return self.hi[slot] << 64 | self.lo[slot]

    def _new_slot(self, lo: int, hi: int, bucket: int) -> int:
        if not self.free:
            self._grow()
        slot = self.free.pop()
        self.lo[slot], self.hi[slot] = lo, hi
        if self.table[bucket] == EMPTY:
            self.used += 1
        self.table[bucket] = slot
        self.live += 1
        return slot

    def _grow(self) -> None:
        """Add spare (dead) slots to every array at once: one extend each, not one append per record."""
        n = len(self.state)
        extra = max(1024, n // 8)
        for name, _ in self.ARRAYS[:-1]:
            column: array[Any] = getattr(self, name)
            column.frombytes(bytes(extra * column.itemsize))
        self.state.extend(bytes(extra))
        self.free.extend(range(n + extra - 1, n - 1, -1))  # popped lowest first

    def delete(self, slot: int) -> None:
        self.tally.changed(slot, self.facts(slot), None)
        self._reopen(slot, self.state[slot], DEAD)
        if self._live_size is not None:
            self._live_size -= self.size[slot]
        bucket = self._bucket(self.lo[slot], self.hi[slot])
        self.table[bucket] = DELETED
        self.state[slot] = DEAD
        self.lo[slot] = self.hi[slot] = 0
        self.free.append(slot)
        self.live -= 1

    def rehash(self) -> None:
        """Rebuild the table for the live slots, at most 35 % full (a linear pass over them)."""
        size = MIN_TABLE
        while size * 35 < self.live * 100:
            size *= 2
        table = array("i", [EMPTY]) * size
        mask = size - 1
        los, state = self.lo, self.state
        for slot in range(len(state)):
            if state[slot] != DEAD:
                i = los[slot] & mask
                while table[i] != EMPTY:
                    i = (i + 1) & mask
                table[i] = slot
        self.table, self.used = table, self.live

    def live_size(self) -> int:
        """Bytes of the live records' latest frames: summed once (after a snapshot load), then
        kept as records change."""
        if self._live_size is None:
            state, size = self.state, self.size
            self._live_size = sum(size[slot] for slot in range(len(state)) if state[slot] != DEAD)
        return self._live_size

    def take_expired(self, now: float) -> list[int]:
        """Live slots whose record has expired at `now`, found through the expiry index (which
        forgets them: the caller deletes them)."""
        return self.tally.take_expired(now)

    def rebuild_tally(self) -> None:
        """Build the tally from the arrays (a snapshot of a release without it): one pass."""
        self.tally = RecordTally(self.facts, _slots, (self._principal_name, self._tool_name, _state_name))
        state, changed, facts = self.state, self.tally.changed, self.facts
        for slot in range(len(state)):
            if state[slot] != DEAD:
                changed(slot, None, facts(slot))

    def after_load(self, used: int | None = None) -> None:
        """Recompute the counters, the free list, the open slots and the task hashes from the
        arrays and `tasks` (after a snapshot load); `used`: the table's buckets not EMPTY, if
        the snapshot says (else counted)."""
        self._live_size = None
        self.live = len(self.state) - self.state.count(DEAD)
        self.used = len(self.table) - self.table.count(EMPTY) if used is None else used
        self.open = {code: set() for code in OPEN_CODES}
        for code, slots in self.open.items():
            i = self.state.find(code)
            while i >= 0:
                slots.add(i)
                i = self.state.find(code, i + 1)
        self.task_hashes = {h for h, _, _ in self.tasks.values()}
        # The dead slots by runs (the spare slots of the last growth are one run), in C: a
        # Python step per dead slot cost a second at ten million records.
        free = array("I")
        for run in _DEAD_RUNS.finditer(self.state):
            free.extend(range(run.start(), run.end()))
        free.reverse()  # popped lowest first
        self.free = free


_DEAD_RUNS = re.compile(rb"\x00+")


def _slots() -> array[int]:
    return array("I")


def _state_name(code: Hashable) -> str:
    return _STATE_NAMES[cast(int, code)]


def step_key(phash: int, step: int) -> int:
    """One int for `(process hash, step index)`: `step * 2**64 + phash`, one-to-one for a 64-bit
    hash and any step (an int key costs less memory than a tuple). `split_step_key` inverts it."""
    return step << 64 | phash


def split_step_key(key: int) -> tuple[int, int]:
    """`(process hash, step index)` of a `step_key`."""
    return key & MASK64, key >> 64


class EntryIndex(Columns):
    """Process entries in sequence order, chained per process (by a 64-bit process hash)."""

    ARRAYS = (("seq", "Q"), ("pos", "Q"), ("size", "I"), ("prev", "q"), ("phash", "Q"))
    seq: array[int]
    pos: array[int]
    size: array[int]
    prev: array[int]
    phash: array[int]

    def __init__(self) -> None:
        super().__init__()
        #: process hash → index of its last entry / of its last checkpoint
        self.last: dict[int, int] = {}
        self.checkpoint: dict[int, int] = {}
        self._total_size: int | None = 0  # bytes of every entry's frame (None: to be summed)
        #: `step_key(process hash, step index)` → how many entries not dropped are that step
        #: (`record_json.step_index`; more than one only through plain `append`). A process
        #: hash may collide: a count says a step *may* exist, and the journal reads the
        #: process's entries to be sure; no count says for certain that none does.
        self.steps: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.seq)

    def add(self, seq: int, position: int, size: int, phash: int, is_checkpoint: bool, step: int | None = None) -> None:
        """Index the entry `seq` of process hash `phash` (`step`: its step index, if a step)."""
        index = len(self.seq)
        self.seq.append(seq)
        self.pos.append(position)
        self.size.append(size)
        if self._total_size is not None:
            self._total_size += size
        self.prev.append(self.last.get(phash, -1))
        self.phash.append(phash)
        self.last[phash] = index
        if is_checkpoint:
            self.checkpoint[phash] = index
        if step is not None:
            key = step_key(phash, step)
            self.steps[key] = self.steps.get(key, 0) + 1

    def total_size(self) -> int:
        """Bytes of every indexed entry's frame (dropped ones too): summed once, then kept."""
        if self._total_size is None:
            self._total_size = sum(self.size)
        return self._total_size

    def forget_size(self) -> None:
        """The arrays were replaced (a snapshot load): sum them again on the next `total_size`."""
        self._total_size = None

    def may_have_step(self, phash: int, step: int) -> bool:
        """Whether a step `step` of a process with hash `phash` may be stored (False: none is)."""
        return step_key(phash, step) in self.steps

    def forget_step(self, phash: int, step: int) -> None:
        """One entry that was step `step` of process hash `phash` is dropped."""
        key = step_key(phash, step)
        left = self.steps.get(key, 0) - 1
        if left > 0:
            self.steps[key] = left
        else:
            self.steps.pop(key, None)

    def without(self, dropped: set[int]) -> EntryIndex:
        """A new index of the entries not in `dropped` (indexes), in the same order. The step
        counts are kept as they are: dropping an entry already forgot its step."""
        kept = EntryIndex()
        checkpoints = {i for i in self.checkpoint.values()}
        for i in range(len(self.seq)):
            if i not in dropped:
                kept.add(self.seq[i], self.pos[i], self.size[i], self.phash[i], i in checkpoints)
        kept.steps = self.steps
        return kept

    def first_after(self, after: int) -> int:
        """Index of the first entry with `seq > after`."""
        return bisect_right(self.seq, after)

    def chain(self, phash: int, after: int) -> list[int]:
        """Indexes of the entries of process hash `phash` with `seq > after`, in order."""
        out: list[int] = []
        i = self.last.get(phash, -1)
        while i >= 0 and self.seq[i] > after:
            out.append(i)
            i = self.prev[i]
        out.reverse()
        return out
