"""The in-memory indexes of the memory and file journals that answer counts, time ranges and
expiries without a walk over every record (`Journal.count_calls`, the retention's expired
records): `RecordTally`, built from `GroupCounts` and `TimeBuckets`.

A record is known here by a *reference* (`R`: the file journal's slot number, the memory
journal's identity) and its *facts* (`Facts`: principal, tool, state, creation and expiry times,
as the journal's own keys: interned numbers in the file journal, strings in the memory one).
The journal tells the tally each change of a record's facts (`RecordTally.changed`); the tally
asks the journal for a reference's current facts (`facts(ref)`, None when the record is gone)
when it reads a bucket, so a bucket may keep references that moved or went: a read drops them.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Hashable, Iterator, MutableSequence
from typing import Generic, TypeVar

from .base import CallCounts, CountQuery, CountTally

R = TypeVar("R", bound=Hashable)

#: Bucket width of the time indexes, in seconds: a range read touches the buckets it overlaps.
WIDTH = 60.0


#: What the tally indexes of one record: `(principal, tool, state, created, expires)`, the first
#: three as the journal's keys, `expires` None (or infinite) for a record that never expires. A
#: plain tuple: one is built for every change of every record.
Facts = tuple[Hashable, Hashable, Hashable, float, float | None]


class TimeBuckets(Generic[R]):
    """References grouped by the `WIDTH`-second bucket of a time (a record's creation or expiry).

    A reference is added when its time is set and never removed in place: one whose record is
    gone, or whose time moved to another bucket, stays until a read of its bucket finds it stale
    (`time_of(ref)` no longer falls in that bucket) and rewrites the bucket without it. So a
    change costs one append and a read costs the size of the buckets it reads. A reference added
    twice to one bucket (a slot reused, a time set twice) is read once.
    """

    __slots__ = ("_new", "buckets", "keys", "_first", "_first_known")

    def __init__(self, new: Callable[[], MutableSequence[R]]) -> None:
        self._new = new
        self.buckets: dict[int, MutableSequence[R]] = {}
        #: The bucket numbers, ascending (new ones mostly come last: times mostly grow).
        self.keys: list[int] = []
        # The earliest reference and its time, when known (`first`): checked on use, so a
        # reference that moved or went since is noticed and the earliest looked for again.
        self._first: tuple[R, float] | None = None
        self._first_known = True

    @staticmethod
    def key(t: float) -> int:
        return math.floor(t / WIDTH)

    def add(self, t: float, ref: R) -> None:
        k = self.key(t)
        bucket = self.buckets.get(k)
        if bucket is None:
            bucket = self.buckets[k] = self._new()
            if not self.keys or k > self.keys[-1]:
                self.keys.append(k)
            else:
                insort(self.keys, k)
        bucket.append(ref)
        if self._first_known and (self._first is None or t < self._first[1]):
            self._first = (ref, t)

    def set_bucket(self, k: int, refs: MutableSequence[R]) -> None:
        """Put a whole bucket in (loading a snapshot)."""
        if k not in self.buckets:
            insort(self.keys, k)
        self.buckets[k] = refs
        self._first_known = False

    def __len__(self) -> int:
        """References held, stale ones included."""
        return sum(len(b) for b in self.buckets.values())

    def live(self, k: int, time_of: Callable[[R], float | None]) -> list[tuple[R, float]]:
        """The references of bucket `k` whose time still falls in it, once each, with that time;
        the bucket is rewritten without the others (and dropped when none is left)."""
        bucket = self.buckets.get(k)
        if bucket is None:
            return []
        seen: set[R] = set()
        found: list[tuple[R, float]] = []
        for ref in bucket:
            t = time_of(ref)
            if t is None or self.key(t) != k or ref in seen:
                continue
            seen.add(ref)
            found.append((ref, t))
        if len(found) != len(bucket):
            self._replace(k, [ref for ref, _ in found])
        return found

    def _replace(self, k: int, refs: list[R]) -> None:
        if refs:
            bucket = self._new()
            bucket.extend(refs)
            self.buckets[k] = bucket
        else:
            del self.buckets[k]
            del self.keys[bisect_left(self.keys, k)]

    def scan(
        self, low: float | None, high: float | None, time_of: Callable[[R], float | None]
    ) -> Iterator[tuple[R, float]]:
        """The live references of every bucket that overlaps `[low, high]` (None: unbounded),
        oldest bucket first: a superset of those whose time lies in the range (callers compare)."""
        start = 0 if low is None else bisect_left(self.keys, self.key(low))
        stop = len(self.keys) if high is None else bisect_right(self.keys, self.key(high))
        for k in self.keys[start:stop]:  # a copy: reading a bucket may drop it
            yield from self.live(k, time_of)

    def first(self, time_of: Callable[[R], float | None]) -> float | None:
        """The earliest live time, or None: the remembered earliest reference if its time is
        unchanged, else the earliest of the first bucket that still holds a live one."""
        if self._first_known:
            if self._first is None:
                return None
            ref, t = self._first
            if time_of(ref) == t:
                return t
        self._first, self._first_known = None, True
        while self.keys:
            found = self.live(self.keys[0], time_of)
            if found:
                self._first = min(found, key=lambda item: item[1])
                return self._first[1]
        return None

    def take(self, high: float, time_of: Callable[[R], float | None]) -> list[R]:
        """Remove and return every live reference whose time is at or before `high`."""
        taken: list[R] = []
        last = self.key(high)
        while self.keys and self.keys[0] <= last:
            k = self.keys[0]
            found = self.live(k, time_of)
            if not found:
                continue  # stale only: `live` dropped the bucket
            kept = [ref for ref, t in found if t > high]
            taken.extend(ref for ref, t in found if t <= high)
            if kept:  # only the bucket of `high` itself holds later times
                self._replace(k, kept)
                break
            self._replace(k, [])
        return taken


class GroupCounts:
    """How many records each `(principal, tool, state)` has (the journal's keys), by principal."""

    __slots__ = ("by_principal",)

    def __init__(self) -> None:
        self.by_principal: dict[Hashable, dict[tuple[Hashable, Hashable], int]] = {}

    def add(self, principal: Hashable, tool: Hashable, state: Hashable, n: int) -> None:
        groups = self.by_principal.get(principal)
        if groups is None:
            groups = self.by_principal[principal] = {}
        group = (tool, state)
        left = groups.get(group, 0) + n
        if left:
            groups[group] = left
        else:
            del groups[group]
            if not groups:
                del self.by_principal[principal]

    def items(self, principal: Hashable | None = None) -> Iterator[tuple[Hashable, Hashable, Hashable, int]]:
        """`(principal, tool, state, n)` of every group (of `principal` only, if given)."""
        principals = self.by_principal if principal is None else (principal,)
        for p in principals:
            for (tool, state), n in self.by_principal.get(p, {}).items():
                yield p, tool, state, n


class RecordTally(Generic[R]):
    """Counts by `(principal, tool, state)`, records by creation time per principal, and by
    expiry time: what `count_calls` and the expiry of records read instead of every record.

    `facts(ref)` gives a reference's current facts (None: no record); `names` turns the
    journal's keys of a principal, tool and state into the names `CallCounts` shows.
    """

    def __init__(
        self,
        facts: Callable[[R], Facts | None],
        new: Callable[[], MutableSequence[R]],
        names: tuple[Callable[[Hashable], str], Callable[[Hashable], str], Callable[[Hashable], str]],
    ) -> None:
        self._facts = facts
        self._new = new
        self._names = names
        self.counts = GroupCounts()
        self.created: dict[Hashable, TimeBuckets[R]] = {}
        self.expiry: TimeBuckets[R] = TimeBuckets(new)

    def changed(self, ref: R, old: Facts | None, new: Facts | None) -> None:
        """Record `ref`'s facts moving from `old` to `new` (None: no record before, or after)."""
        if new is None:
            if old is not None:
                self.counts.add(old[0], old[1], old[2], -1)
            return  # the buckets drop `ref` when they next read it
        principal, tool, state, created, expires = new
        if old is None:
            self.counts.add(principal, tool, state, 1)
            self.created_of(principal).add(created, ref)
        else:
            if old[2] != state or old[1] != tool or old[0] != principal:
                self.counts.add(old[0], old[1], old[2], -1)
                self.counts.add(principal, tool, state, 1)
            if old[3] != created or old[0] != principal:
                self.created_of(principal).add(created, ref)
            if old[4] == expires:
                return
        if expires is not None and expires < math.inf:
            self.expiry.add(expires, ref)

    def created_of(self, principal: Hashable) -> TimeBuckets[R]:
        buckets = self.created.get(principal)
        if buckets is None:
            buckets = self.created[principal] = TimeBuckets(self._new)
        return buckets

    def _created_time(self, principal: Hashable) -> Callable[[R], float | None]:
        def time_of(ref: R) -> float | None:
            f = self._facts(ref)
            return None if f is None or f[0] != principal else f[3]

        return time_of

    def _expiry_time(self, ref: R) -> float | None:
        f = self._facts(ref)
        return None if f is None or f[4] is None or not f[4] < math.inf else f[4]

    def count(self, query: CountQuery, principal: Hashable | None, known: bool = True) -> CallCounts:
        """`count_calls(query)`; `principal` is the journal's key of `query.principal` (`known`
        False: that principal has no record, so nothing counts)."""
        tally = CountTally()
        if query.principal is not None and not known:
            return tally.counts()
        principals = list(self.created) if principal is None else [principal]
        p_name, t_name, s_name = self._names
        if not query.ranged:
            for p, tool, state, n in self.counts.items(principal):
                tally.add(p_name(p), t_name(tool), s_name(state), n)
            for p in principals:
                if p in self.created:
                    tally.oldest(self.created[p].first(self._created_time(p)))
            return tally.counts()
        for p in principals:
            buckets = self.created.get(p)
            if buckets is None:
                continue
            name = p_name(p)
            for ref, created in buckets.scan(query.since, query.until, self._created_time(p)):
                if query.in_range(created):
                    f = self._facts(ref)
                    assert f is not None
                    tally.add(name, t_name(f[1]), s_name(f[2]), 1, created, query.bucket(created))
        return tally.counts()

    def take_expired(self, now: float) -> list[R]:
        """Remove from the expiry index and return every reference whose record expired at `now`."""
        return self.expiry.take(now, self._expiry_time)
