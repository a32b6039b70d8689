"""What the engine and its callers hand each other: a tool's outcome, the engine's answer, the callables.

Its own module, below the engine, its runner and its tasks (`engine.py`, `runner.py`, `tasks.py`), so all name
these types without importing each other. No `mcp` import, no I/O.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

from ..journal.model import CallRecord
from ..policy import ToolPolicy
from ..steps import DurableCall


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What running a tool produced: the opaque `value` to hand back on this first run, and the
    JSON bytes to persist and replay. `is_error` marks an error result: a deliberate one (kept or
    released by `ToolPolicy.tool_errors`), or, with `from_exception`, one that stands for an
    exception kept under `exceptions="persist"` (which `tool_errors` does not release)."""

    value: Any
    payload: bytes
    is_error: bool
    final: bool = True  # False for an interim answer (more input needed): released, not persisted
    from_exception: bool = False


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """What the engine answers a call with.

    `value` is the tool's own result object on a run (None on a replay); `payload` the stored JSON
    bytes (None for an unkeyed call, which is not journaled); `replayed` whether it came from
    the journal without this call running anything; `reconciled` whether a reconcile hook
    supplied it; `superseded` whether this call ran the tool (or its hook) but another outcome
    was recorded for the key first — its owner's lease was taken over, or an operator resolved
    it — so the answer is the recorded outcome, not this run's (`replayed` is False: it ran).
    `rendered` is what the face made of a replayed outcome (`Engine.render_replay`), kept with it
    in the engine's replay cache so that every repeat answered from there gets it as it is;
    None when not made. Whoever gets it must not mutate it.
    """

    key: str | None
    value: Any
    payload: bytes | None
    replayed: bool
    first_completed_at: float | None
    reconciled: bool = False
    attempt: int = 1
    superseded: bool = False
    rendered: Any = None


#: Runs the tool once (given the durable call, None for an unkeyed call) and says what it produced.
Runner = Callable[[DurableCall | None], Awaitable[ToolOutcome]]
#: Turns a reconcile hook's found result into the outcome to persist and answer.
Encoder = Callable[[Any], ToolOutcome]
#: Hears of every change of a record (resources, notifications, telemetry): `Engine.listeners`.
#: Synchronous (returns None) or a coroutine function; the engine awaits what it returns, if anything.
#: Ours are synchronous: a listener runs between a claim and the tool's run, on every call.
ChangeListener = Callable[[CallRecord], Awaitable[None] | None]
#: Resumes a task record in the background (set by the MCP face, which can run its tool).
TaskResumer = Callable[[CallRecord], Awaitable[None]]


class CallArguments(TypedDict):
    """One call as the face hands it over (the keywords of `Engine.execute` and `Engine.submit`).

    `arguments` are the validated arguments, `meta` the request's `_meta` (where a caller's key
    is), `run` runs the tool, `encode` turns a reconcile hook's answer into an outcome, and
    `canonical` is `keys.canonical_json(arguments)` and `fingerprint`
    `keys.policy_fingerprint(policy, arguments)` when the caller has them already.
    """

    tool: str
    policy: ToolPolicy
    arguments: Mapping[str, Any]
    meta: Mapping[str, Any] | None
    run: Runner
    encode: NotRequired[Encoder | None]
    principal: NotRequired[str]
    canonical: NotRequired[bytes | None]
    fingerprint: NotRequired[str | None]
