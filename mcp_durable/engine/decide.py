"""What a call should do about the record its key has: one pure function, a closed set of answers.

`decide` reads the record (None when the key has none), the call's fingerprint, the tool's
policy, the time and whether a PENDING record's owner is alive, and returns one `Decision`.
The engine (engine.py) carries the decision out; `submit_decision` is the same for a call that
creates an MCP task (engine/tasks.py). Neither does I/O.

| record                                         | decision        | the engine then                         |
|------------------------------------------------|-----------------|-----------------------------------------|
| none, or expired                               | CLAIM           | claims it (`transitions.claimed`), runs  |
| other fingerprint                              | KEY_REUSE       | refuses `key_reuse`                      |
| COMPLETED / FAILED                             | REPLAY          | answers the stored result               |
| PENDING, owner alive                           | WAIT            | latches on; `in_progress` past `wait`    |
| PENDING, owner gone                            | MARK_IN_DOUBT   | `transitions.doubted(LOST_OWNER)`, again |
| RELEASED by a cancel                           | REFUSE_CANCELLED| refuses `cancelled`                      |
| RELEASED otherwise                             | TAKE_OVER       | `transitions.taken_over`, runs           |
| IN_DOUBT, attempts ≥ max_attempts              | PARK            | `transitions.parked`, refuses `in_doubt` |
| IN_DOUBT, policy refuse                        | REFUSE_IN_DOUBT | refuses `in_doubt`                       |
| IN_DOUBT, policy reconcile                     | RECONCILE       | owns it, asks the hook, completes or runs|
| IN_DOUBT, policy retry                         | TAKE_OVER       | `transitions.taken_over`, runs           |
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from ..journal.model import CallRecord, CallState
from ..policy import ToolPolicy


class Decision(Enum):
    """What a call does about the record its key has (the module's table)."""

    CLAIM = "claim"
    KEY_REUSE = "key_reuse"
    REPLAY = "replay"
    WAIT = "wait"
    MARK_IN_DOUBT = "mark_in_doubt"
    REFUSE_CANCELLED = "refuse_cancelled"
    TAKE_OVER = "take_over"
    PARK = "park"
    REFUSE_IN_DOUBT = "refuse_in_doubt"
    RECONCILE = "reconcile"


#: Whether the owner of a PENDING record may still be running it (`LiveOwners.alive`).
OwnerAlive = Callable[[CallRecord, float], bool]


def decide(
    record: CallRecord | None, fingerprint: str, policy: ToolPolicy, now: float, owner_alive: OwnerAlive
) -> Decision:
    """The decision for a call with `fingerprint` whose key has `record` (the module's table).

    `owner_alive` is asked only about a PENDING record."""
    if record is None or record.is_expired(now):
        return Decision.CLAIM
    if record.fingerprint != fingerprint:
        return Decision.KEY_REUSE
    state = record.state
    if state is CallState.COMPLETED or state is CallState.FAILED:
        return Decision.REPLAY
    if state is CallState.PENDING:
        return Decision.WAIT if owner_alive(record, now) else Decision.MARK_IN_DOUBT
    if state is CallState.RELEASED:
        return Decision.REFUSE_CANCELLED if record.cancelled else Decision.TAKE_OVER
    return in_doubt_decision(record, policy)


def in_doubt_decision(record: CallRecord, policy: ToolPolicy) -> Decision:
    """What the tool's policy makes of an IN_DOUBT record: PARK, REFUSE_IN_DOUBT, RECONCILE or TAKE_OVER."""
    if record.attempts >= policy.max_attempts:
        return Decision.PARK
    mode = policy.in_doubt_policy
    if mode == "refuse":
        return Decision.REFUSE_IN_DOUBT
    if mode == "reconcile":
        return Decision.RECONCILE
    return Decision.TAKE_OVER


class TaskDecision(Enum):
    """What a task-creating call does about the record its key has (`submit_decision`)."""

    CLAIM = "claim"  # none or expired: a new task
    KEY_REUSE = "key_reuse"
    RESTART = "restart"  # released without a result (not cancelled): run again as a new task
    ATTACH = "attach"  # a call made without a task: attach one to it
    EXISTING = "existing"  # the key's task: answer with it (resumed if its owner is gone)


def submit_decision(record: CallRecord | None, fingerprint: str, now: float) -> TaskDecision:
    """The decision for a task-creating call with `fingerprint` whose key has `record`.

    A cancelled record answers with its (cancelled) task, never a new run. A call in doubt gets a
    task attached, whose status follows the record (a refused one is `failed`, so cancelling it
    changes nothing)."""
    if record is None or record.is_expired(now):
        return TaskDecision.CLAIM
    if record.fingerprint != fingerprint:
        return TaskDecision.KEY_REUSE
    if record.state is CallState.RELEASED and not record.cancelled:
        return TaskDecision.RESTART
    if record.task_id is None:
        return TaskDecision.ATTACH
    return TaskDecision.EXISTING
