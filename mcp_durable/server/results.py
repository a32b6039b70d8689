"""Turning engine answers into MCP results: replay marking, and refusals as `isError` results.

The one function that maps `DurableError`s to `structuredContent.error` codes is `refusal()`.
"""

from __future__ import annotations

from datetime import UTC, datetime
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


def iso_time(ts: float | None) -> str | None:
    """Epoch seconds as an ISO 8601 UTC timestamp (what `_meta` and resources show)."""
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def dump_result(result: CallToolResult) -> bytes:
    """The JSON bytes a result is journaled as: its wire form, so replay is byte-identical."""
    return orjson.dumps(result.model_dump(by_alias=True, mode="json", exclude_none=True))


def load_result(payload: bytes) -> CallToolResult:
    return CallToolResult.model_validate(orjson.loads(payload), by_name=False)


def _with_meta(result: CallToolResult, extra: dict[str, Any]) -> CallToolResult:
    merged = {**(result.meta or {}), **extra}
    return result.model_copy(update={"meta": merged})


def answer(outcome: CallOutcome) -> CallToolResult:
    """The result to send for an engine outcome: the tool's own on a run, the stored one on replay."""
    if outcome.payload is None:
        assert isinstance(outcome.value, CallToolResult)
        return outcome.value  # unkeyed call: not journaled, not marked
    if outcome.replayed:
        result = load_result(outcome.payload)
    elif isinstance(outcome.value, CallToolResult):
        result = outcome.value
    else:
        result = load_result(outcome.payload)
    meta: dict[str, Any] = {META_KEY: outcome.key}
    if outcome.replayed:
        meta[META_REPLAYED] = True
    if outcome.first_completed_at is not None:
        meta[META_FIRST_COMPLETED] = iso_time(outcome.first_completed_at)
    if outcome.reconciled:
        meta[META_RECONCILED] = True
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
