"""Whose PENDING records are alive: the engine's bookkeeping of the calls it is inside right now.

A PENDING record names its owner. Whether that owner may still be running the tool decides
between waiting for it and marking the record in doubt, so getting it wrong either way is the
worst bug this code can have: a live call taken for dead runs twice; a dead one taken for live
blocks its key until its lease runs out. The rules (`LiveOwners.alive`):

- A record this instance owns is alive exactly while this instance is inside its call
  (`holding`), whatever its lease says: a stalled heartbeat must not turn our own running call
  in doubt, and a call we are no longer in is dead even while its lease runs.
- On a single-writer journal the only live owners are the instances started on that journal
  object in this process (`_LIVE_OWNERS`): the writer lock keeps other processes out, so a
  PENDING record of any other owner is a previous boot's orphan.
- Otherwise (a journal shared by replicas) an owner is alive while its lease is.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from functools import partial
from types import TracebackType
from typing import Any

import anyio

from ..journal import callers
from ..journal.base import Journal
from ..journal.model import CallIdentity, CallRecord

#: The instances of this process started on each journal object. On a single-writer journal the
#: only live owners are these (the writer lock keeps other processes out), so a PENDING record
#: of any other owner is a previous boot's orphan — and two engines sharing one journal object
#: in a process never mistake each other's running calls for orphans.
_LIVE_OWNERS: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def live_owners(journal: Journal) -> set[str]:
    """The instances started on `journal` in this process (see `_LIVE_OWNERS`)."""
    try:
        return _LIVE_OWNERS.setdefault(journal, set())
    except TypeError:  # a journal object that cannot be weakly referenced: no sharing known
        return set()


class LiveOwners:
    """One engine instance's view of which owners are alive on its journal.

    `running` counts, per identity, how many times this instance is inside a call for it right
    now: from the moment a claim or take-over is sent until the outcome is persisted (or
    released). Held before the write is sent, because a duplicate may read the committed claim
    before the claiming coroutine resumes; held through the persist, because the record is
    still PENDING until that write lands. Counted, because two of this instance's duplicates
    may both try to take one record over, and the loser must not drop the winner's hold. Every
    hold is also a call in flight for the journal's batching (`journal/callers.py`): the write
    of the only call in flight need not wait for others to join its batch.
    """

    __slots__ = ("journal", "instance_id", "running", "holding")

    def __init__(self, journal: Journal, instance_id: str) -> None:
        self.journal = journal
        self.instance_id = instance_id
        self.running: dict[CallIdentity, int] = {}
        #: `with owners.holding(identity):` — inside a call for `identity`, shielded from
        #: cancellation. For a claim or take-over and the run it starts: the hold begins before
        #: the write is sent and ends after the outcome is written. Shielded, because a claim
        #: the caller abandons half-way would leave a PENDING record whose tool never ran, later
        #: mistaken for a crash in the danger window. A partial rather than a method: it is on
        #: every call's path, and this saves a Python call there.
        self.holding: Callable[[CallIdentity], Holding] = partial(Holding, self.running)

    def join(self) -> None:
        """This instance has started on the journal: its records are no previous boot's."""
        live_owners(self.journal).add(self.instance_id)

    def leave(self) -> None:
        """This instance has stopped: on a single-writer journal its records are orphans now."""
        live_owners(self.journal).discard(self.instance_id)

    def alive(self, record: CallRecord, now: float) -> bool:
        """Whether the owner of a PENDING record may still be running its tool (module docstring)."""
        if record.owner == self.instance_id:
            return record.identity in self.running
        lease_valid = record.lease_until is not None and record.lease_until > now
        if self.journal.single_writer:
            return lease_valid and record.owner in live_owners(self.journal)
        return lease_valid

    def hold(self, identity: CallIdentity) -> None:
        """Count this instance inside a call for `identity` (before its claim is sent)."""
        self.running[identity] = self.running.get(identity, 0) + 1
        callers.enter()

    def unhold(self, identity: CallIdentity) -> None:
        """The matching end of one `hold`."""
        left = self.running.pop(identity) - 1
        if left:
            self.running[identity] = left
        callers.leave()


class Holding:
    """The context manager of `LiveOwners.holding`: a class, not a generator (it is on every
    call's path, and a generator-based context manager costs several times more). The hold
    and the shield end together, whatever leaves the block."""

    __slots__ = ("_running", "_identity", "_shield")

    def __init__(self, running: dict[CallIdentity, int], identity: CallIdentity) -> None:
        self._running = running
        self._identity = identity
        self._shield = anyio.CancelScope(shield=True)

    def __enter__(self) -> None:
        self._shield.__enter__()
        self._running[self._identity] = self._running.get(self._identity, 0) + 1
        callers.enter()  # the calls in flight, which tell a lone write it may skip the batching turn

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            callers.leave()
            left = self._running.pop(self._identity) - 1
            if left:
                self._running[self._identity] = left
        finally:
            # Never swallows: only a cancel of this scope itself would be, and nobody else holds it.
            self._shield.__exit__(exc_type, exc, tb)
