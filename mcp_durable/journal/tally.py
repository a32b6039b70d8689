"""The in-memory indexes of the memory and file journals that answer counts, time ranges,
listings newest first and expiries without a walk over every record (`Journal.count_calls`,
`Journal.list_calls`, the retention's expired records): `RecordTally`, built from `GroupCounts`
and `TimeRuns`.

A record is known here by a *reference* (`R`: the file journal's slot number, the memory
journal's identity) and its *facts* (`Facts`: principal, tool, state, creation and expiry times,
as the journal's own keys: interned numbers in the file journal, strings in the memory one).
The journal tells the tally each change of a record's facts (`RecordTally.changed`); the tally
asks the journal for a reference's current facts (`facts(ref)`, None when the record is gone)
when it reads a run, so a run may keep references that moved or went: a read drops them.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Hashable, Iterable, Iterator, MutableSequence
from typing import Generic, TypeVar

from .base import CallCounts, CountQuery, CountTally

R = TypeVar("R", bound=Hashable)

#: The most references a run holds before it is split in two (unless they all share one time).
RUN = 1024

#: What the tally indexes of one record: `(principal, tool, state, created, expires)`, the first
#: three as the journal's keys, `expires` None (or infinite) for a record that never expires. A
#: plain tuple: one is built for every change of every record.
Facts = tuple[Hashable, Hashable, Hashable, float, float | None]

TimeOf = Callable[[R], "float | None"]


class TimeRuns(Generic[R]):
    """References ordered by a time (a record's creation or expiry) in *runs*: run `i` holds the
    references whose time lies in `[starts[i], starts[i + 1])` (the last run: up to infinity), in
    no order within it. A run is split in two when it passes `RUN` references, so a run holds
    from about `RUN / 2` to `RUN` whatever the rate at which records come: a read of the newest
    or oldest references, or of a time range, costs the runs it touches, never the whole index.

    `time_of(ref)` is a reference's current time here (None: the record is gone, or no longer
    belongs to this index). A reference is added when its time is set and never removed in
    place: one whose record went or whose time moved stays until a read of its run finds it
    stale (its time no longer falls in the run) and rewrites the run without it. Every live
    reference is in the run whose range holds its time (an addition goes there; a split sorts
    the live ones; a run is removed only when no live one is left), so a read of a run finds
    each reference whose time lies in that range. A reference added twice is read once.

    Times mostly come in order (a record is created now; it expires a fixed time after it
    completes), so additions mostly land in the last run. When that run is full and the new
    time is later than every time it was given (`highs`), the new time starts a run of its own:
    every live reference of the full run keeps a time in its now bounded range, and the run
    need not be read and sorted to split it.
    """

    __slots__ = ("_new", "time_of", "starts", "runs", "limits", "highs", "_first", "_first_known")

    def __init__(self, new: Callable[[], MutableSequence[R]], time_of: TimeOf[R]) -> None:
        self._new = new
        self.time_of = time_of
        self.starts: list[float] = []
        self.runs: list[MutableSequence[R]] = []
        #: The length at which each run is split next (`RUN`, more for one that could not be
        #: split because its references share one time).
        self.limits: list[int] = []
        #: Each run's latest time given to it (an addition's, or a split's latest live one), so
        #: at least the time of each live reference it holds; infinite where not known (a run
        #: loaded by `put_run`).
        self.highs: list[float] = []
        # The earliest reference and its time, when known (`first`): checked on use, so a
        # reference that moved or went since is noticed and the earliest looked for again.
        self._first: tuple[R, float] | None = None
        self._first_known = True

    def add(self, t: float, ref: R) -> None:
        starts = self.starts
        last = len(starts) - 1
        if last >= 0 and t >= starts[last] and len(self.runs[last]) < self.limits[last]:
            # The commonest addition (times come mostly in order): into the last run, which has
            # room, so no run is made and none needs looking for.
            i = last
        elif not starts or t < starts[0]:
            if not starts or len(self.runs[0]) >= self.limits[0]:
                self._insert(0, t, [], -math.inf)
            else:
                starts[0] = t  # lowering the first run's start: no live reference changes runs
            i = 0
        else:
            i = bisect_right(starts, t) - 1
            if i == len(starts) - 1 and t > self.highs[i] and len(self.runs[i]) >= self.limits[i]:
                # Later than all the full last run holds: a run of its own (the class docstring).
                self._insert(i + 1, t, [], -math.inf)
                i += 1
        run = self.runs[i]
        run.append(ref)
        if t > self.highs[i]:
            self.highs[i] = t
        if len(run) > self.limits[i]:
            self._split(i)
        if self._first_known and (self._first is None or t < self._first[1]):
            self._first = (ref, t)

    def _insert(self, i: int, start: float, refs: Iterable[R], high: float) -> None:
        run = self._new()
        run.extend(refs)
        self.starts.insert(i, start)
        self.runs.insert(i, run)
        self.limits.insert(i, max(RUN, len(run)))
        self.highs.insert(i, high)

    def put_run(self, start: float, refs: MutableSequence[R]) -> None:
        """Append a whole run after the last one (loading a snapshot; runs come in time order)."""
        self.starts.append(start)
        self.runs.append(refs)
        self.limits.append(max(RUN, len(refs)))
        self.highs.append(math.inf)  # its times are not known without reading it
        self._first_known = False

    def _split(self, i: int) -> None:
        found = self.live(i)
        found.sort(key=lambda item: item[1])
        if len(found) * 4 <= RUN * 3:
            self.limits[i] = RUN  # stale references made the room
            return
        times = [t for _, t in found]
        half = times[len(times) // 2]
        cut = bisect_left(times, half)  # equal times stay in one run
        if cut == 0:
            cut = bisect_right(times, half)
        if cut >= len(found):
            self.limits[i] = 2 * len(found)  # one time throughout: split no more until it doubles
            return
        left = self._new()
        left.extend(ref for ref, _ in found[:cut])
        self.runs[i], self.limits[i], self.highs[i] = left, RUN, times[cut - 1]
        self._insert(i + 1, times[cut], (ref for ref, _ in found[cut:]), times[-1])

    def __len__(self) -> int:
        """References held, stale ones included."""
        return sum(len(run) for run in self.runs)

    def live(self, i: int) -> list[tuple[R, float]]:
        """The references of run `i` whose time still falls in it, once each, with that time;
        the run is rewritten without the others (an empty run stays until `_drop_empty`)."""
        run = self.runs[i]
        low = self.starts[i]
        high = self.starts[i + 1] if i + 1 < len(self.starts) else math.inf
        time_of = self.time_of
        seen: set[R] = set()
        found: list[tuple[R, float]] = []
        for ref in run:
            t = time_of(ref)
            if t is None or not low <= t < high or ref in seen:
                continue
            seen.add(ref)
            found.append((ref, t))
        if len(found) != len(run):
            kept = self._new()
            kept.extend(ref for ref, _ in found)
            self.runs[i] = kept
        return found

    def _drop_empty(self, i: int) -> None:
        """Remove run `i`, which holds no live reference (its range joins the run before it)."""
        del self.starts[i], self.runs[i], self.limits[i], self.highs[i]

    def _span(self, low: float | None, high: float | None) -> range:
        """The runs that overlap `[low, high]` (None: unbounded)."""
        start = 0 if low is None else max(0, bisect_right(self.starts, low) - 1)
        stop = len(self.starts) if high is None else bisect_right(self.starts, high)
        return range(start, stop)

    def scan(self, low: float | None, high: float | None) -> Iterator[tuple[R, float]]:
        """The live references of every run that overlaps `[low, high]` (None: unbounded),
        oldest run first: a superset of those whose time lies in the range (callers compare)."""
        for i in self._span(low, high):  # `live` keeps the runs in place: the indexes hold
            yield from self.live(i)

    def newest(self, top: float) -> Iterator[tuple[float, R]]:
        """`(time, ref)` of the live references with a time at or before `top`, newest first
        (equal times in no particular order). Reads one run at a time, as the caller goes on:
        the caller must not change the index until it stops reading."""
        for i in reversed(self._span(None, top)):
            found = [(t, ref) for ref, t in self.live(i) if t <= top]
            found.sort(key=_time, reverse=True)
            yield from found

    def first(self) -> float | None:
        """The earliest live time, or None: the remembered earliest reference if its time is
        unchanged, else the earliest of the first run that still holds a live one."""
        if self._first_known:
            if self._first is None:
                return None
            ref, t = self._first
            if self.time_of(ref) == t:
                return t
        self._first, self._first_known = None, True
        while self.runs:
            found = self.live(0)
            if found:
                self._first = min(found, key=lambda item: item[1])
                return self._first[1]
            self._drop_empty(0)
        return None

    def take(self, high: float) -> list[R]:
        """Remove and return every live reference whose time is at or before `high`."""
        taken: list[R] = []
        while self.runs and self.starts[0] <= high:
            found = self.live(0)
            kept = [ref for ref, t in found if t > high]
            taken.extend(ref for ref, t in found if t <= high)
            if kept:  # only the run that holds `high` itself holds later times
                run = self._new()
                run.extend(kept)
                self.runs[0] = run
                break
            self._drop_empty(0)
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
        _bump(groups, (tool, state), n)
        if not groups:
            del self.by_principal[principal]

    def move(self, principal: Hashable, tool: Hashable, old: Hashable, new: Hashable) -> None:
        """One record of `(principal, tool)` moved from state `old` to `new` (the commonest
        change, a completion): what `add` of -1 and then of 1 does, with one lookup of the principal."""
        groups = self.by_principal.get(principal)
        if groups is None:
            groups = self.by_principal[principal] = {}
        _bump(groups, (tool, old), -1)
        _bump(groups, (tool, new), 1)
        if not groups:
            del self.by_principal[principal]

    def items(self, principal: Hashable | None = None) -> Iterator[tuple[Hashable, Hashable, Hashable, int]]:
        """`(principal, tool, state, n)` of every group (of `principal` only, if given)."""
        principals = self.by_principal if principal is None else (principal,)
        for p in principals:
            for (tool, state), n in self.by_principal.get(p, {}).items():
                yield p, tool, state, n


def _bump(groups: dict[tuple[Hashable, Hashable], int], group: tuple[Hashable, Hashable], n: int) -> None:
    """Add `n` to `group`'s count in `groups`, dropping the group when it comes to 0."""
    left = groups.get(group, 0) + n
    if left:
        groups[group] = left
    else:
        del groups[group]


class RecordTally(Generic[R]):
    """Counts by `(principal, tool, state)`, records by creation time per `(principal, tool)`
    (a *stream*), and by expiry time: what `count_calls`, a listing newest first and the expiry
    of records read instead of every record.

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
        #: principal → tool → its records by creation time.
        self.created: dict[Hashable, dict[Hashable, TimeRuns[R]]] = {}
        self.expiry: TimeRuns[R] = TimeRuns(new, self._expiry_time)

    def changed(self, ref: R, old: Facts | None, new: Facts | None) -> None:
        """Record `ref`'s facts moving from `old` to `new` (None: no record before, or after)."""
        if new is None:
            if old is not None:
                self.counts.add(old[0], old[1], old[2], -1)
            return  # the runs drop `ref` when they next read it
        principal, tool, state, created, expires = new
        if old is None:
            self.counts.add(principal, tool, state, 1)
            self.stream(principal, tool).add(created, ref)
        else:
            if old[0] != principal or old[1] != tool:
                self.counts.add(old[0], old[1], old[2], -1)
                self.counts.add(principal, tool, state, 1)
            elif old[2] != state:
                self.counts.move(principal, tool, old[2], state)
            if old[3] != created or old[0] != principal or old[1] != tool:
                self.stream(principal, tool).add(created, ref)
            if old[4] == expires:
                return
        if expires is not None and expires < math.inf:
            self.expiry.add(expires, ref)

    def moved(
        self,
        ref: R,
        principal: Hashable,
        tool: Hashable,
        old: tuple[Hashable, float | None],
        new: tuple[Hashable, float | None],
    ) -> None:
        """`changed` for a record whose principal, tool and creation time stay (its commonest
        change): its `(state, expires)` move from `old` to `new`."""
        if old[0] != new[0]:
            self.counts.move(principal, tool, old[0], new[0])
        expires = new[1]
        if old[1] != expires and expires is not None and expires < math.inf:
            self.expiry.add(expires, ref)

    def stream(self, principal: Hashable, tool: Hashable) -> TimeRuns[R]:
        """The records of `(principal, tool)` by creation time (created empty if none is)."""
        tools = self.created.get(principal)
        if tools is None:
            tools = self.created[principal] = {}
        runs = tools.get(tool)
        if runs is None:
            runs = tools[tool] = TimeRuns(self._new, self._created_time(principal, tool))
        return runs

    def streams(self, principal: Hashable | None = None, tool: Hashable | None = None) -> list[TimeRuns[R]]:
        """The creation-time indexes of `principal` (None: every one) and `tool` (None: every one)."""
        principals = self.created.values() if principal is None else [self.created.get(principal, {})]
        if tool is None:
            return [runs for tools in principals for runs in tools.values()]
        return [runs for tools in principals if (runs := tools.get(tool)) is not None]

    def _created_time(self, principal: Hashable, tool: Hashable) -> TimeOf[R]:
        facts = self._facts

        def time_of(ref: R) -> float | None:
            f = facts(ref)
            return None if f is None or f[0] != principal or f[1] != tool else f[3]

        return time_of

    def _expiry_time(self, ref: R) -> float | None:
        f = self._facts(ref)
        return None if f is None or f[4] is None or not f[4] < math.inf else f[4]

    def newest(
        self, principal: Hashable | None = None, tool: Hashable | None = None, top: float = math.inf
    ) -> Iterator[tuple[float, R]]:
        """`(created, ref)` of the records of `principal` and `tool` (None: any) created at or
        before `top`, newest first (equal times in no particular order): a merge of their
        streams, each read one run at a time as the caller goes on, so the newest `n` cost about
        `n` plus a run per stream, whatever the number of records. The caller must not change
        the tally until it stops reading."""
        streams = [runs.newest(top) for runs in self.streams(principal, tool)]
        if len(streams) == 1:
            return streams[0]
        return heapq.merge(*streams, key=_time, reverse=True)

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
                for runs in self.created.get(p, {}).values():
                    tally.oldest(runs.first())
            return tally.counts()
        for p in principals:
            name = p_name(p)
            for tool, runs in self.created.get(p, {}).items():
                tool_name = t_name(tool)
                for ref, created in runs.scan(query.since, query.until):
                    if query.in_range(created):
                        f = self._facts(ref)
                        assert f is not None
                        tally.add(name, tool_name, s_name(f[2]), 1, created, query.bucket(created))
        return tally.counts()

    def take_expired(self, now: float) -> list[R]:
        """Remove from the expiry index and return every reference whose record expired at `now`."""
        return self.expiry.take(now)


def _time(item: tuple[float, object]) -> float:
    return item[0]
