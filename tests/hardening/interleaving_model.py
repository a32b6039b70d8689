"""The bookkeeping of `test_engine_interleavings.py`: its tools, its runs, the answers it waits
for, and what each key has shown so far.

No engine calls here: the state machine drives the engines and keeps these objects; they say
what a record means for a check (`held`, `task_terminal`) and when a pending answer has come
or stopped moving (`Op.done`, `Op.quiet`). The invariants are stated in the test module.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import orjson

from mcp_durable import ToolPolicy
from mcp_durable.journal import CallRecord, CallState, Journal

#: Clock seconds a claim is valid. Leases are renewed every `LEASE / 3` *real* seconds, far
#: longer than an example lasts: no renewal ever lands, and only the controlled clock decides
#: whether an owner's lease has run out.
LEASE = 60.0
RETENTION = 600.0
MAX_ATTEMPTS = 4
PRINCIPAL = "alice"
KEY = "k1"  # one key per tool: every rule on a tool meets the others on that key
ARGUMENTS = {"n": 1}  # one set of arguments per key: no key_reuse, by design
#: Whether this engine bounds a run by real seconds (`ToolPolicy.timeout`, the new engine's).
HAS_TIMEOUT = "timeout" in {f.name for f in dataclasses.fields(ToolPolicy)}

Ident = tuple[str, str]  # (tool, key): one principal calls every tool
Fence = tuple[str, str, int]  # (owner, run_id, attempts) of a PENDING record: who may write to it
Behaviour = Literal["ok", "error", "raise", "raise_persisted"]
GateAt = Literal["before", "between", "hang"]


class Boom(Exception):
    """A tool's unexpected exception (always raised before its effect)."""


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool under test: idempotent (in_doubt="retry") or not (in_doubt="refuse"); with `steps`,
    its effects are two durable steps (`effect-0`, `effect-1`), else one effect in its body."""

    name: str
    idempotent: bool
    steps: bool

    def policy(self, *, wait: float = 0.0, exceptions: str = "release", timeout: float | None = None) -> ToolPolicy:
        """Its policy. `wait` 0 by default: a call that finds a live owner is answered
        `in_progress` at once instead of waiting real seconds for a run parked at a gate."""
        policy = ToolPolicy(
            idempotent=self.idempotent,
            in_doubt="retry" if self.idempotent else "refuse",
            lease=LEASE,
            retention=RETENTION,
            max_attempts=MAX_ATTEMPTS,
            wait=wait,
            exceptions="persist" if exceptions == "persist" else "release",
        )
        if timeout is not None:
            bounded: dict[str, Any] = {"timeout": timeout}  # a field of the new engine's policy only
            policy = dataclasses.replace(policy, **bounded)
        return policy


TOOLS = {
    tool.name: tool
    for tool in (
        Tool("pay", idempotent=False, steps=False),
        Tool("ship", idempotent=False, steps=True),
        Tool("sync", idempotent=True, steps=False),
        Tool("book", idempotent=True, steps=True),
    )
}
IDENTS: list[Ident] = [(tool, KEY) for tool in TOOLS]


@dataclass(eq=False)
class Run:
    """One runner handed to one engine: it counts its effects and may park at its gate.

    `gate_at` is where it parks: "before" its effect (its first step), "between" its two steps,
    "hang" (before its effect, a gate nobody opens: only the engine's timeout ends it), or None.
    `fence` is the (owner, run_id, attempt) it started under; `parked` is true while it waits
    at its gate.
    """

    serial: int
    ident: Ident
    slot: int
    owner: str
    journal: Journal  # its engine's journal object: what its steps read their record from
    behaviour: Behaviour
    gate_at: GateAt | None
    linger: bool = False
    gate: anyio.Event = field(default_factory=anyio.Event)
    started: bool = False
    parked: bool = False
    task: asyncio.Task[Any] | None = None  # the task it parked in
    fence: Fence | None = None

    @property
    def payload(self) -> bytes:
        """This run's own answer: unique to the run, so a stale or replayed one is recognised."""
        return orjson.dumps(
            {"run": self.serial, "tool": self.ident[0], "key": self.ident[1], "behaviour": self.behaviour}
        )

    async def park(self) -> None:
        """Wait at the gate (until `resume` opens it, or forever for a crashed engine's run)."""
        self.parked, self.task = True, asyncio.current_task()
        try:
            await self.gate.wait()
        finally:
            self.parked = False

    @property
    def waiting(self) -> bool:
        """Parked, and nothing will wake it: its gate is shut and no cancel is on its way to it
        (a flag alone would call a run parked in the turn between its gate opening, or its cancel
        scope being cancelled, and the run waking up)."""
        return self.parked and not self.gate.is_set() and not (self.task is not None and self.task.cancelling())


@dataclass(eq=False)
class CancelMark:
    """A cancel the engine accepted: by the task's requestor or by an operator, until `expires_at`."""

    by: str
    expires_at: float | None

    def live(self, now: float) -> bool:
        return self.expires_at is None or self.expires_at > now


@dataclass(eq=False)
class Op:
    """Something driven that has not been answered yet: an `execute` (its answer is its task's
    result) or a `submit`'s background run (the tasks it spawned). `cancel` is the cancel that
    was in force over the key when it began: such a call must be answered `cancelled`."""

    kind: Literal["call", "task"]
    run: Run
    tasks: set[asyncio.Task[Any]]
    cancel: CancelMark | None
    crashed: bool = False

    def done(self) -> bool:
        return all(task.done() for task in self.tasks)

    def quiet(self) -> bool:
        """Done, or parked at a gate that only a rule opens (a hung run is not: its timeout ends it)."""
        return self.done() or (self.run.waiting and self.run.gate_at != "hang")

    def answer(self) -> Any:
        """What `execute` answered: a `CallOutcome` or the exception it raised (the task returns it)."""
        (task,) = self.tasks
        return task.result()


@dataclass(eq=False)
class Ledger:
    """What one key has shown: its live final result and when that expires, its record's attempts
    while the record lives, the cancel over it, and (for a non-idempotent tool without steps) the
    effects it made against the effects it was allowed."""

    final: bytes | None = None
    final_expires: float | None = None
    attempts: int | None = None
    #: The `created_at` of the record `attempts` was read from (a key's new record starts again).
    attempts_since: float | None = None
    cancel: CancelMark | None = None
    effects: int = 0
    permits: int = 1

    def live_final(self, now: float) -> bytes | None:
        if self.final is not None and (self.final_expires is None or self.final_expires > now):
            return self.final
        return None

    def live_cancel(self, now: float) -> CancelMark | None:
        return self.cancel if self.cancel is not None and self.cancel.live(now) else None


def fence_of(record: CallRecord) -> Fence | None:
    """Who may write to a PENDING record (None for any other state)."""
    if record.state != CallState.PENDING or record.owner is None:
        return None
    return (record.owner, record.run_id, record.attempts)


def held(record: CallRecord | None, fence: Fence | None) -> bool:
    """Whether `record` is still PENDING under `fence`: the run that started under it owns it."""
    return record is not None and fence is not None and fence_of(record) == fence


def task_terminal(record: CallRecord) -> bool:
    """Whether the task `record` is has a terminal status (tasks.py): completed or failed (a final
    record), cancelled or failed (released), or in doubt where nothing runs it again (its tool
    refuses, or it is parked after `MAX_ATTEMPTS`)."""
    if record.state.is_final or record.state == CallState.RELEASED:
        return True
    if record.state == CallState.IN_DOUBT:
        return not TOOLS[record.identity.tool].idempotent or record.attempts >= MAX_ATTEMPTS
    return False


def describe(record: CallRecord | None) -> str:
    """A record in one line, for a violation's message."""
    if record is None:
        return "no record"
    result = record.result.decode() if record.result is not None else None
    return (
        f"{record.state.value} v{record.version} attempts={record.attempts} owner={record.owner} "
        f"run={record.run_id[:8]} result={result} error={record.error!r} task={record.task_id is not None}"
    )
