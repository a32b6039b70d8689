"""Turning engine answers into MCP results: replay marking, and refusals as `isError` results.

The one function that maps `DurableError`s to `structuredContent.error` codes is `refusal()`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

import orjson
from mcp_types import CallToolResult, TextContent

from ..engine import CallOutcome
from ..errors import DurableError

META_KEY = "mcp-durable/key"
META_REPLAYED = "mcp-durable/replayed"
META_FIRST_COMPLETED = "mcp-durable/first-completed-at"
META_RECONCILED = "mcp-durable/reconciled"
META_ATTEMPT = "mcp-durable/attempt"
#: This call ran the tool, but another outcome was recorded for the key first (its lease was
#: taken over, or an operator resolved it): the result is the recorded one (engine.CallOutcome).
META_SUPERSEDED = "mcp-durable/superseded"


@lru_cache(maxsize=4096)  # a replayed key shows the same completion time on every repeat
def iso_time(ts: float | None) -> str | None:
    """Epoch seconds as an ISO 8601 UTC timestamp (what `_meta` and resources show)."""
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def dump_result(result: CallToolResult) -> bytes:
    """The JSON bytes a result is journaled as: its wire form, so replay is byte-identical."""
    return orjson.dumps(result.model_dump(by_alias=True, mode="json", exclude_none=True))


def load_result(payload: bytes) -> CallToolResult:
    return CallToolResult.model_validate(orjson.loads(payload), by_name=False)


# A repeat of a key is answered with the same bytes and the same `_meta` every time: build that
# answer once per record and hand the same object out again. Safe because nothing mutates a
# result once returned (the SDK dumps it into fresh dicts, and stamps its own `_meta` on the
# copy). Bounded: _REPLAYS answers of stored results of at most _REPLAY_MAX_BYTES each.
_REPLAYS = 1024
_REPLAY_MAX_BYTES = 16 * 1024
_replays: dict[tuple[str | None, bytes, float | None, bool], CallToolResult] = {}


def _with_meta(result: CallToolResult, extra: dict[str, Any]) -> CallToolResult:
    merged = {**(result.meta or {}), **extra}
    return result.model_copy(update={"meta": merged})


def answer(outcome: CallOutcome) -> CallToolResult:
    """The result to send for an engine outcome: the tool's own on a run, the stored one on replay.

    A replay's result may be the very object an earlier replay of the same record got: callers
    must not mutate it.
    """
    if outcome.payload is None:
        assert isinstance(outcome.value, CallToolResult)
        return outcome.value  # unkeyed call: not journaled, not marked
    if outcome.replayed:
        cache_key = (outcome.key, outcome.payload, outcome.first_completed_at, outcome.reconciled)
        replayed = _replays.get(cache_key)
        if replayed is None:
            replayed = _answer(load_result(outcome.payload), outcome)
            if len(outcome.payload) <= _REPLAY_MAX_BYTES:
                if len(_replays) >= _REPLAYS:
                    del _replays[next(iter(_replays))]  # oldest first
                _replays[cache_key] = replayed
        return replayed
    if isinstance(outcome.value, CallToolResult):
        return _answer(outcome.value, outcome)
    return _answer(load_result(outcome.payload), outcome)


def _answer(result: CallToolResult, outcome: CallOutcome) -> CallToolResult:
    meta: dict[str, Any] = {META_KEY: outcome.key}
    if outcome.replayed:
        meta[META_REPLAYED] = True
    if outcome.first_completed_at is not None:
        meta[META_FIRST_COMPLETED] = iso_time(outcome.first_completed_at)
    if outcome.reconciled:
        meta[META_RECONCILED] = True
    if outcome.superseded:
        meta[META_SUPERSEDED] = True
    return _with_meta(result, meta)


def refusal(error: DurableError, key: str | None = None) -> CallToolResult:
    """A refused call as an `isError` result: `structuredContent.error` is the code, with a message."""
    structured: dict[str, Any] = {"error": error.code, "message": error.message, **error.details()}
    meta = {META_KEY: key} if key is not None else None
    return CallToolResult(
        content=[TextContent(type="text", text=f"{error.code}: {error.message}")],
        structured_content=structured,
        is_error=True,
        _meta=meta,
    )
