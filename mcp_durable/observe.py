"""Seams where telemetry observes the engine, steps, leases and journals (no dependency; no-op by default).

The engine and the journals call these functions at the few places worth measuring; they do
nothing until an observer is installed, so a server with telemetry off pays one context-variable
read per seam. A face observes its calls by default (operations/telemetry.py), and its observer
answers a seam with a no-op while the call's span does not record (OpenTelemetry not set up).
Observers watch, never decide: an observer's failure is logged and ignored.

- Per call (`CallObserver`, bound for the duration of one durable call by the MCP face with
  `bind_call`): `span(name, attributes)` wraps the claim, each durable step and the persist in a
  child span; `waited()` marks a call that latched on to a running duplicate.
- Per process (`add_journal_observer`): `journal_committed(backend, seconds, batch)` after each
  commit a journal makes durable (a group-commit batch of `batch` writes: the file journal's
  flush, SQLite's batch transaction, a Postgres batched statement), and
  `lease_renewal_failed(backend)` when a running call's lease could not be renewed. Journal
  observers may be called from a journal's worker thread (SQLite's): they must be thread-safe
  (OpenTelemetry's instruments are).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar, Token
from typing import Any, Protocol

logger = logging.getLogger(__name__)

AttributeValue = str | bool | int | float


class CallObserver(Protocol):
    """Observes one durable call. Methods run on the event loop and must not raise."""

    def span(self, name: str, attributes: Mapping[str, AttributeValue]) -> AbstractContextManager[Any]:
        """A child span of the call's span around one part of it (claim, step, persist)."""
        ...

    def waited(self) -> None:
        """The call waited for a duplicate in flight (latched on)."""
        ...


class JournalObserver(Protocol):
    def journal_committed(self, backend: str, seconds: float, batch: int) -> None: ...

    def lease_renewal_failed(self, backend: str) -> None: ...


_call: ContextVar[CallObserver | None] = ContextVar("mcp_durable_call_observer", default=None)
_journal_observers: list[JournalObserver] = []
_NULL: AbstractContextManager[Any] = nullcontext()


def bind_call(observer: CallObserver | None) -> Token[CallObserver | None]:
    """Make `observer` the current call's observer (undo with `unbind_call(token)`)."""
    return _call.set(observer)


def unbind_call(token: Token[CallObserver | None]) -> None:
    _call.reset(token)


def span(name: str, **attributes: AttributeValue) -> AbstractContextManager[Any]:
    """`with observe.span("durable.claim"):` — a child span when the call is observed, else nothing."""
    observer = _call.get()
    if observer is None:
        return _NULL
    try:
        return observer.span(name, attributes)
    except Exception:  # noqa: BLE001 - observers never fail a call
        logger.exception("a telemetry observer failed")
        return _NULL


def waited() -> None:
    observer = _call.get()
    if observer is not None:
        observer.waited()


def add_journal_observer(observer: JournalObserver) -> Callable[[], None]:
    """Register a process-wide journal observer; returns an idempotent unregister callable."""
    _journal_observers.append(observer)

    def remove() -> None:
        if observer in _journal_observers:
            _journal_observers.remove(observer)

    return remove


def journal_committed(backend: str, seconds: float, batch: int) -> None:
    for observer in _journal_observers:
        try:
            observer.journal_committed(backend, seconds, batch)
        except Exception:  # noqa: BLE001 - observers never fail a write
            logger.exception("a telemetry observer failed")


def lease_renewal_failed(backend: str) -> None:
    for observer in _journal_observers:
        try:
            observer.lease_renewal_failed(backend)
        except Exception:  # noqa: BLE001
            logger.exception("a telemetry observer failed")
