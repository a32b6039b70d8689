"""What a running durable tool sees: its key, its attempt, and journaled steps.

Inside a durable tool, `current_call()` returns the `DurableCall` of the call being run (a
context variable the engine sets; it follows sync tools onto their worker thread):

    call = current_call()
    provider.refund(order_id, amount, idempotency_key=call.key)     # pass the key downstream
    label = await call.step("buy label", buy_label, order_id)        # journaled, run once

Steps are stored as process-journal entries of the process `steps/<run_id>`; a run keeps its
`run_id` across in-doubt retries, so a re-execution replays the steps that completed and
resumes at the first unfinished one.

A step is journaled after `fn` returns, so a crash between a step's side effect and its journal
entry runs that one step again on the retry (at least once per step, never from the start):
pass `call.step_key(name)` downstream so the system there deduplicates it. Steps of one call
run one after another (their position is their identity); do not run them concurrently.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import anyio.from_thread

from . import observe
from .errors import CallCancelledError, DeterminismError, TaskCancelledError
from .journal.base import Journal
from .journal.model import CallIdentity, JournalEntry
from .keys import scoped_key, step_key
from .tasks import is_cancelled, is_operator_cancelled

STEP_ENTRY = "step"

_current: ContextVar[DurableCall | None] = ContextVar("mcp_durable_current_call", default=None)


def current_call() -> DurableCall:
    """The durable call being run. Raises `LookupError` outside a durable tool."""
    call = _current.get()
    if call is None:
        raise LookupError("current_call() is only available inside a durable tool")
    return call


def current_key() -> str | None:
    """The key of the durable call being run, or None outside one (or for an unkeyed call)."""
    call = _current.get()
    return None if call is None else call.key


@dataclass(eq=False)
class DurableCall:
    """A running durable call: identity, key, attempt, and `step()` for durable steps.

    `_done` holds the steps the journal has for this run, replayed in order before any
    step runs again; `steps_replayed` and `steps_run` count what `step()` did."""

    identity: CallIdentity
    run_id: str
    attempt: int
    _journal: Journal = field(repr=False)
    _clock: Callable[[], float] = field(repr=False)
    _done: list[JournalEntry] = field(repr=False)
    _next: int = field(default=0, init=False, repr=False)
    steps_replayed: int = field(default=0, init=False)
    steps_run: int = field(default=0, init=False)

    @property
    def key(self) -> str:
        """The idempotency key: pass it to downstream systems (an `Idempotency-Key` header)."""
        return self.identity.key

    @property
    def scoped_key(self) -> str:
        """The key scoped by principal, for a downstream system shared by several principals:
        `keys.scoped_key(principal, key)`, so two callers' keys never deduplicate into each other
        downstream (the bare key for `local`, `principal:key` otherwise; see there)."""
        return scoped_key(self.identity.principal, self.identity.key)

    def step_key(self, name: str) -> str:
        """A downstream idempotency key for one step of this call: `scoped_key/name`
        (`keys.step_key`: separators in the name encoded, hashed when over 255 characters).
        Stable across retries of the call."""
        return step_key(self.identity.principal, self.identity.key, name)

    @property
    def process_id(self) -> str:
        return steps_process_id(self.run_id)

    async def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run `fn(*args, **kwargs)` once per run: a re-execution returns the journaled result.

        The result must be JSON-serialisable (it is journaled). A step whose name differs from
        the journal's step at the same position raises `DeterminismError`.
        """
        index = self._next
        self._next += 1
        if index < len(self._done):
            recorded = self._done[index].data
            if recorded["name"] != name:
                raise DeterminismError(index, recorded["name"], name)
            self.steps_replayed += 1
            with observe.span("durable.step", step=name, index=index, replayed=True):
                return recorded["result"]
        with observe.span("durable.step", step=name, index=index, replayed=False):
            await self._stop_if_cancelled()
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            await self._journal.append(
                self.process_id, STEP_ENTRY, {"index": index, "name": name, "result": result}, self._clock()
            )
        self.steps_run += 1
        return result

    async def _stop_if_cancelled(self) -> None:
        """Raise the cancel if this run's call was cancelled (an operator's, or its task's requestor's):
        a run stops at its next durable step at the latest, even between lease renewals."""
        record = await self._journal.get(self.identity)
        if record is not None and record.run_id == self.run_id and is_cancelled(record):
            if is_operator_cancelled(record):
                raise CallCancelledError(self.identity.tool, self.identity.key)
            raise TaskCancelledError(self.identity.tool, self.identity.key)

    def step_sync(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`step()` for a sync tool running on its worker thread."""
        return anyio.from_thread.run(lambda: self.step(name, fn, *args, **kwargs))


def steps_process_id(run_id: str) -> str:
    return f"steps/{run_id}"


async def load_steps(journal: Journal, run_id: str) -> list[JournalEntry]:
    """The completed steps of a run, in order."""
    entries = await journal.entries(process_id=steps_process_id(run_id))
    return [e for e in entries if e.entry_type == STEP_ENTRY]


def bind(call: DurableCall | None) -> Any:
    """Make `call` current; returns the token to pass to `unbind`."""
    return _current.set(call)


def unbind(token: Any) -> None:
    _current.reset(token)

