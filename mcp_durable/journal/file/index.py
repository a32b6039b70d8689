"""The in-memory index: where the latest frame of every record is, in a few flat arrays.

Memory is the constraint (ten million records must open in 600 MB), so nothing here is an
object per record. A call record is a *slot*: one position in parallel `array`s (its hash, frame
position (segment and offset) and size, version, state, times, interned tool and principal),
38 bytes while its narrow columns' values stay small (`NARROW`: segment numbers below 65,536,
frames below 64 KiB, versions and the numbers of tools and principals below 256), plus 4 to 12 bytes of an
open-addressing table from the identity's hash to its slot (an array too, saved in snapshots as
it is). Results and arguments stay on disk: a `get()` reads the frame back.

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
HI_BITS = 16
HI_MASK = (1 << HI_BITS) - 1
#: The bits of an identity's 128-bit hash the index keeps (`lo` and `hi`): 80. Two identities of
#: ten million share them with a chance of about 4 in 10^11, and a read compares the whole
#: identity (a clash is reported as one, never answered with the other record).
HASH_MASK = (1 << (64 + HI_BITS)) - 1
#: The type codes a narrow column goes through as its values grow, narrowest first.
WIDTHS = ("B", "H", "I", "Q")
SEGMENT_SHIFT = 40  # a position is segment number << 40 | byte offset (segments stay < 1 TiB)
OFFSET_MASK = (1 << SEGMENT_SHIFT) - 1
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
    return position >> SEGMENT_SHIFT, position & OFFSET_MASK


def split_positions(positions: array[int]) -> tuple[array[int], array[int]]:
    """Packed positions (`pack`) as their segment numbers and offsets, each in the narrowest
    of `WIDTHS` that holds them (from "H" and "I", the columns' own)."""
    segments = narrowest(array("Q", (p >> SEGMENT_SHIFT for p in positions)), "H")
    offsets = narrowest(array("Q", (p & OFFSET_MASK for p in positions)), "I")
    return segments, offsets


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

    def shared(self, name: str) -> str:
        """`name` as the string object held here (one copy in memory however many hold it), or
        `name` itself when it is not here."""
        found = self.ids.get(name)
        return name if found is None else self.names[found]


class Columns:
    """A struct of arrays: one `array` attribute per `(name, typecode)` of `ARRAYS`, created
    empty. `ARRAYS` is also what the snapshot saves and loads, so a column's typecode is
    stated once. A column named in `NARROW` starts at that (narrow, unsigned) typecode and is
    widened through `WIDTHS` by `put_narrow` when a value does not fit: its typecode is then the
    array's own, which is what a snapshot saves."""

    ARRAYS: ClassVar[tuple[tuple[str, str], ...]] = ()
    NARROW: ClassVar[frozenset[str]] = frozenset()

    def __init__(self) -> None:
        for name, code in self.ARRAYS:
            setattr(self, name, array(code))

    def put_narrow(self, name: str, slot: int, value: int) -> None:
        """Set `value` in slot `slot` of the narrow column `name`, widening the column first if
        it does not fit (a copy of the column, once per width it passes). `OverflowError` for a
        value no width holds (negative, or 2^64 and above), as a plain 'Q' column raised."""
        column: array[int] = getattr(self, name)
        try:
            column[slot] = value
        except OverflowError:
            column = widened(column, value)
            setattr(self, name, column)
            column[slot] = value


def fits(code: str, value: int) -> bool:
    """Whether `value` is an unsigned integer that an array of `code` holds."""
    return 0 <= value < 1 << (8 * array(code).itemsize)


def widened(column: array[int], value: int) -> array[int]:
    """A copy of `column` in the narrowest of `WIDTHS` wider than its own that holds `value`;
    `OverflowError` when none does."""
    for code in WIDTHS[WIDTHS.index(column.typecode) + 1 :]:
        if fits(code, value):
            return array(code, column)
    raise OverflowError(f"{value} does not fit an unsigned 64-bit column")


def narrowest(column: array[int], start: str) -> array[int]:
    """`column` in the narrowest of `WIDTHS`, from `start` on, that holds all its values (itself
    when that is its own typecode): a snapshot of an earlier format saved these columns wide."""
    top = max(column, default=0)
    for code in WIDTHS[WIDTHS.index(start) :]:
        if fits(code, top):
            return column if code == column.typecode else array(code, column)
    raise OverflowError(f"{top} does not fit an unsigned 64-bit column")


class CallIndex(Columns):
    """Call records by identity hash: slot arrays plus an open-addressing table of slots.

    `table` (an `array("i")`, a power of two long, at most 70 % used) maps a hash to its slot by
    linear probing from its low bits; `-1` is an empty bucket, `-2` one whose slot was deleted.
    Probes compare the 80 bits of the hash the index keeps (`lo`, `hi`: `HASH_MASK`), so a
    clash is left to the reader's identity check, and the table is saved in the snapshot as it
    is: loading ten million records builds nothing.

    No sequence number is kept per slot: a slot whose latest frame may not be on disk yet is in
    `queued` (its frame's seq), the others' frames are on disk.
    """

    ARRAYS = (
        ("lo", "Q"),
        ("hi", "H"),
        ("segment", "H"),
        ("offset", "I"),
        ("size", "H"),
        ("version", "B"),
        ("created", "d"),
        ("expires", "d"),
        ("tool", "B"),
        ("principal", "B"),
        ("table", "i"),
    )
    NARROW = frozenset({"segment", "offset", "size", "version", "tool", "principal"})

    lo: array[int]
    hi: array[int]
    segment: array[int]
    offset: array[int]
    size: array[int]
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
        #: principal → task id → the index's hash (`HASH_MASK` bits) of the record that is that
        #: task: the record is found by its hash, read, and its principal and task id compared.
        #: Tasks are few next to calls, so dicts (saved in the snapshot as sections). Entries of
        #: purged records are dropped by `prune_tasks`; a stale one is harmless (reads compare).
        self.tasks: dict[str, dict[str, int]] = {}
        #: The hashes among `tasks`' values (the same int objects): a record whose hash is not
        #: here is no task (one that is here may be no task any more: readers compare its task id).
        self.task_hashes: set[int] = set()
        #: The slots of the records in each open state (`OPEN_CODES`), kept by `put_fields` and
        #: `delete`; not saved in snapshots (`after_load` finds them in `state`).
        self.open: dict[int, set[int]] = {code: set() for code in OPEN_CODES}
        #: Slot → seq of its latest frame, for frames that may not be on disk yet (`queue`);
        #: a slot not here has its latest frame on disk. Not saved: a snapshot's are on disk.
        self.queued: dict[int, int] = {}
        self._queued_limit = QUEUED_MIN
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
        bucket = self._bucket(h & MASK64, h >> 64 & HI_MASK)
        return self.table[bucket] if bucket >= 0 else None

    def queue(self, slot: int, seq: int, durable: int) -> None:
        """Note that `slot`'s latest frame is `seq`, maybe not on disk yet; `durable` is the
        highest seq known to be on disk. Slots whose frame is on disk by then are forgotten in
        one pass each time `queued` doubles, so it stays about the frames in flight."""
        queued = self.queued
        queued[slot] = seq
        if len(queued) >= self._queued_limit:
            self.queued = {s: q for s, q in queued.items() if q > durable}
            self._queued_limit = max(QUEUED_MIN, 2 * len(self.queued))

    def position(self, slot: int) -> int:
        """Where `slot`'s latest frame is (`pack(segment, offset)`)."""
        return self.segment[slot] << SEGMENT_SHIFT | self.offset[slot]

    def set_position(self, slot: int, position: int) -> None:
        segment, offset = unpack(position)
        self.put_narrow("segment", slot, segment)
        self.put_narrow("offset", slot, offset)

    def queued_seq(self, slot: int) -> int:
        """The seq of `slot`'s latest frame if it may not be on disk yet, else 0."""
        return self.queued.get(slot, 0)

    def put(self, h: int, record: CallRecord, position: int, size: int) -> int:
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
    ) -> int:
        """Point the identity hash `h` at its latest frame (`position`, `size`) with these
        fields; returns its slot."""
        lo, hi = h & MASK64, h >> 64 & HI_MASK
        bucket = self._bucket(lo, hi)
        if bucket < 0 and (self.used + 1) * 10 > len(self.table) * 7:
            self.rehash()  # before the new slot exists, so the rebuilt table has room for it
            bucket = self._bucket(lo, hi)
        tool_id, principal_id = self.tools.ids.get(tool), self.principals.ids.get(principal)
        if tool_id is None or principal_id is None:  # a name not seen before: numbered now
            tool_id, principal_id = self.tools.id(tool), self.principals.id(principal)
        expiry = NO_EXPIRY if expires is None else expires
        if bucket >= 0:
            slot = self.table[bucket]
            if self.tool[slot] == tool_id and self.principal[slot] == principal_id and self.created[slot] == created:
                # The commonest put of a record already here (a completion, a renewal, a
                # release): its identity and creation time stay, so only its frame, version,
                # state and expiry are written, and the tally moves its state and expiry.
                self._update(slot, version, state, expiry, position, size)
                return slot
            before = self.facts(slot)
        else:
            slot, before = self._new_slot(lo, hi, -1 - bucket), None
        if self._live_size is not None:
            self._live_size += size - (self.size[slot] if before is not None else 0)
        self._set_frame(slot, position, size, version)
        self.state[slot] = state
        self.created[slot] = created
        self.expires[slot] = expiry
        self.put_narrow("tool", slot, tool_id)
        self.put_narrow("principal", slot, principal_id)
        self.tally.changed(slot, before, self.facts(slot))
        was = DEAD if before is None else cast(int, before[2])
        if was != state:
            self._reopen(slot, was, state)
        return slot

    def _update(self, slot: int, version: int, state: int, expiry: float, position: int, size: int) -> None:
        """`put_fields` of a live slot whose tool, principal and creation time are unchanged."""
        was, was_expiry = self.state[slot], self.expires[slot]
        if self._live_size is not None:
            self._live_size += size - self.size[slot]
        self._set_frame(slot, position, size, version)
        self.state[slot] = state
        self.expires[slot] = expiry
        self.tally.moved(slot, self.principal[slot], self.tool[slot], (was, was_expiry), (state, expiry))
        if was != state:
            self._reopen(slot, was, state)

    def _set_frame(self, slot: int, position: int, size: int, version: int) -> None:
        """Set `slot`'s frame position, frame size and version, widening a narrow column that a
        value does not fit (`put_narrow`); the plain stores first, as a value mostly fits."""
        segment, offset = unpack(position)
        try:
            self.segment[slot] = segment
            self.offset[slot] = offset
            self.size[slot] = size
            self.version[slot] = version
        except OverflowError:  # stores already made are made again: each is a plain set
            self.put_narrow("segment", slot, segment)
            self.put_narrow("offset", slot, offset)
            self.put_narrow("size", slot, size)
            self.put_narrow("version", slot, version)

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

    def put_task(self, task_id: str | None, h: int, principal: str) -> None:
        """Note that the record of identity hash `h` (of `principal`) is task `task_id` (None: none)."""
        if task_id is not None:
            tasks = self.tasks.get(principal)
            if tasks is None:
                tasks = self.tasks[self.principals.shared(principal)] = {}
            tasks[task_id] = kept = h & HASH_MASK
            self.task_hashes.add(kept)

    def task_hash(self, principal: str, task_id: str) -> int | None:
        """The index's hash of the record that is (or was) task `task_id` of `principal`."""
        tasks = self.tasks.get(principal)
        return None if tasks is None else tasks.get(task_id)

    def prune_tasks(self) -> None:
        """Forget tasks whose record is gone (after a purge)."""
        if self.tasks:
            find = self.find
            pruned = {p: {t: h for t, h in tasks.items() if find(h) is not None} for p, tasks in self.tasks.items()}
            self.tasks = {p: tasks for p, tasks in pruned.items() if tasks}
            self.task_hashes = self._hashes_of_tasks()

    def _hashes_of_tasks(self) -> set[int]:
        return {h for tasks in self.tasks.values() for h in tasks.values()}

    def hash_of(self, slot: int) -> int:
        """The hash the index keeps of `slot`'s identity: its full hash's `HASH_MASK` bits (as
        `task_hashes` holds them)."""
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
        # A fixed step, not a share of `n`: each array over-allocates on its own (a sixteenth,
        # and pages not yet written are not resident), so growing is still cheap, and the slots
        # a journal adds after its snapshot's (which leaves the spare ones out) cost what they hold.
        extra = GROW_SLOTS
        for name, _ in self.ARRAYS[:-1]:
            column: array[Any] = getattr(self, name)
            column.frombytes(bytes(extra * column.itemsize))
        self.state.extend(bytes(extra))
        self.free.extend(range(n + extra - 1, n - 1, -1))  # popped lowest first

    def delete(self, slot: int) -> None:
        self.tally.changed(slot, self.facts(slot), None)
        self._reopen(slot, self.state[slot], DEAD)
        self.queued.pop(slot, None)
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
        self.task_hashes = self._hashes_of_tasks()
        self.queued = {}
        # The dead slots by runs (the spare slots of the last growth are one run), in C: a
        # Python step per dead slot cost a second at ten million records.
        free = array("I")
        for run in _DEAD_RUNS.finditer(self.state):
            free.extend(range(run.start(), run.end()))
        free.reverse()  # popped lowest first
        self.free = free


_DEAD_RUNS = re.compile(rb"\x00+")
#: Slots added to every array at once when none is free (`CallIndex._grow`).
GROW_SLOTS = 1024
#: `CallIndex.queued` is swept of frames on disk when it reaches this many slots (or twice what
#: the last sweep kept).
QUEUED_MIN = 1024


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
