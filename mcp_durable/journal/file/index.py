"""The in-memory index: where the latest frame of every record is, in a few flat arrays.

Memory is the constraint (a million records must load in well under 300 MB), so nothing here is
an object per record. A call record is a *slot*: one position in parallel `array`s (its hash,
frame position and size, sequence number, version, state, times, interned tool and principal),
about 65 bytes. The identity is found through a dict from the low 64 bits of its 128-bit hash to
the slot (the high 64 bits are checked in an array); the rare identities whose low halves
collide live in a small `overflow` dict keyed by the whole hash. Results and arguments stay on
disk: a `get()` reads the frame back.

Process entries are likewise arrays (sequence number, position, size, previous entry of the same
process, process hash), with per-process chains so `entries(process_id=…)` and
`last_checkpoint()` read only that process's frames.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right

from ..model import CallRecord, CallState

MASK64 = (1 << 64) - 1
SEGMENT_SHIFT = 40  # a position is segment number << 40 | byte offset (segments stay < 1 TiB)
NO_EXPIRY = float("inf")
DEAD = 0
STATE_CODES = {CallState.PENDING: 1, CallState.COMPLETED: 2, CallState.FAILED: 3,
               CallState.IN_DOUBT: 4, CallState.RELEASED: 5}  # fmt: skip
CODE_STATES: dict[int, CallState] = {code: state for state, code in STATE_CODES.items()}


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


class CallIndex:
    """Call records by identity hash: slot arrays plus the hash → slot maps."""

    ARRAYS = (("lo", "Q"), ("hi", "Q"), ("pos", "Q"), ("size", "I"), ("seq", "Q"), ("version", "Q"),
              ("created", "d"), ("expires", "d"), ("tool", "I"), ("principal", "I"))  # fmt: skip

    def __init__(self) -> None:
        self.lo = array("Q")
        self.hi = array("Q")
        self.pos = array("Q")
        self.size = array("I")
        self.seq = array("Q")
        self.version = array("Q")
        self.created = array("d")
        self.expires = array("d")
        self.tool = array("I")
        self.principal = array("I")
        self.state = bytearray()
        self.tools = Interned()
        self.principals = Interned()
        self.primary: dict[int, int] = {}
        self.overflow: dict[int, int] = {}
        self.free: list[int] = []

    def __len__(self) -> int:
        """Live records."""
        return len(self.state) - self.state.count(DEAD)

    def find(self, h: int) -> int | None:
        if self.overflow:
            slot = self.overflow.get(h)
            if slot is not None:
                return slot
        slot = self.primary.get(h & MASK64)
        if slot is not None and self.hi[slot] == h >> 64:
            return slot
        return None

    def put(self, h: int, record: CallRecord, position: int, size: int, seq: int) -> int:
        """Point the identity `h` at its latest frame; returns its slot."""
        return self.put_fields(
            h, record.version, STATE_CODES[record.state], record.created_at, record.expires_at,
            record.identity.tool, record.identity.principal, position, size, seq,
        )  # fmt: skip

    def put_fields(self, h: int, version: int, state: int, created: float, expires: float | None, tool: str,
                   principal: str, position: int, size: int, seq: int) -> int:  # fmt: skip
        slot = self.find(h)
        if slot is None:
            slot = self._new_slot(h)
        self.pos[slot] = position
        self.size[slot] = size
        self.seq[slot] = seq
        self.version[slot] = version
        self.state[slot] = state
        self.created[slot] = created
        self.expires[slot] = NO_EXPIRY if expires is None else expires
        self.tool[slot] = self.tools.id(tool)
        self.principal[slot] = self.principals.id(principal)
        return slot

    def hash_of(self, slot: int) -> int:
        return self.hi[slot] << 64 | self.lo[slot]

    def _new_slot(self, h: int) -> int:
        lo, hi = h & MASK64, h >> 64
        if self.free:
            slot = self.free.pop()
            self.lo[slot], self.hi[slot] = lo, hi
        else:
            slot = len(self.state)
            self.lo.append(lo)
            self.hi.append(hi)
            for name, _ in self.ARRAYS[2:]:
                getattr(self, name).append(0)
            self.state.append(DEAD)
        if lo in self.primary:
            self.overflow[h] = slot  # another identity owns this low half
        else:
            self.primary[lo] = slot
        return slot

    def delete(self, slot: int) -> None:
        h = self.hi[slot] << 64 | self.lo[slot]
        if self.overflow.pop(h, None) is None:
            del self.primary[self.lo[slot]]
        self.state[slot] = DEAD
        self.lo[slot] = self.hi[slot] = 0
        self.free.append(slot)

    def expired(self, now: float) -> list[int]:
        """Live slots whose record has expired at `now`."""
        state, expires = self.state, self.expires
        return [slot for slot, at in enumerate(expires) if at <= now and state[slot] != DEAD]

    def live_slots(self) -> list[int]:
        state = self.state
        return [slot for slot in range(len(state)) if state[slot] != DEAD]

    def rebuild_maps(self) -> None:
        """Recompute `primary`, `overflow` and `free` from the arrays (after a snapshot load)."""
        n = len(self.state)
        dead = self.state.count(DEAD)
        primary = dict(zip(self.lo.tolist(), range(n), strict=True))  # C speed; dead slots share key 0
        expected = n - dead + (1 if dead else 0)
        if len(primary) == expected and (not dead or self.state[primary[0]] == DEAD):
            if dead:
                del primary[0]
            self.primary, self.overflow = primary, {}
        else:  # a 64-bit collision (or a live hash with low half 0): the careful way
            self.primary, self.overflow = {}, {}
            for slot in range(n):
                if self.state[slot] == DEAD:
                    continue
                lo = self.lo[slot]
                if lo in self.primary:
                    self.overflow[self.hi[slot] << 64 | lo] = slot
                else:
                    self.primary[lo] = slot
        free: list[int] = []
        i = self.state.find(DEAD)
        while i >= 0:
            free.append(i)
            i = self.state.find(DEAD, i + 1)
        self.free = free


class EntryIndex:
    """Process entries in sequence order, chained per process (by a 64-bit process hash)."""

    ARRAYS = (("seq", "Q"), ("pos", "Q"), ("size", "I"), ("prev", "q"), ("phash", "Q"))

    def __init__(self) -> None:
        self.seq = array("Q")
        self.pos = array("Q")
        self.size = array("I")
        self.prev = array("q")
        self.phash = array("Q")
        #: process hash → index of its last entry / of its last checkpoint
        self.last: dict[int, int] = {}
        self.checkpoint: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.seq)

    def add(self, seq: int, position: int, size: int, phash: int, is_checkpoint: bool) -> None:
        index = len(self.seq)
        self.seq.append(seq)
        self.pos.append(position)
        self.size.append(size)
        self.prev.append(self.last.get(phash, -1))
        self.phash.append(phash)
        self.last[phash] = index
        if is_checkpoint:
            self.checkpoint[phash] = index

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
