"""Operator tools over MCP: resolve an in-doubt call, purge expired records. Admins only.

Registered by `DurableServer` only when it has admin principals (`DurableServer(admin_principals=…)`, or
`$MCP_DURABLE_ADMINS`, a comma-separated list, where the environment is trusted: `trust_env`, the
command line; mcp_durable/config.py); a call from any other principal is refused
before anything is read. Over HTTP the principal is the bearer token's identity; on stdio and
in memory it is `local`, which may be configured as an admin.

- `journal_resolve(tool, key, resolution, result=None, principal=None, note="")`: the
  operator's verdict on a call in doubt, via `Engine.resolve`: `completed` (the effect happened;
  `result` is what repeats of the key replay from now on), `failed` (replay an error result) or
  `not_applied` (the effect did not happen: the next call with the key runs). `principal` names
  whose record (default: the caller's own).
- `journal_forget(tool, key, principal=None, note="")`: forget a call in doubt, via
  `Engine.forget`: its record expires now, so the next call with the key runs as a new call.
- `journal_cancel(tool, key, principal=None, note="")`: cancel a running (or in-doubt) call, via
  `Engine.cancel`: its owner stops the tool at its next lease renewal or durable step, and the
  call is never resumed.
- `journal_rerun(tool, key, from_step=None, principal=None, note="")`: re-run a completed or
  failed call under a new attempt, via `Engine.rerun`: the next call with its key runs the tool
  again, replaying the durable steps before index `from_step`.
- `journal_purge_expired()`: drop records whose retention has ended (`Engine.purge_expired`).

Each action journals an audit entry naming the admin who acted and the note (`operators.py`).
A refusal (`forbidden`, `operator_error`, `journal_unavailable`, …) is raised as the
`DurableError` itself: `DurableServer.call_tool` answers it like a durable call's refusal, with
the code in `_meta["mcp-durable/error"]` (`results.refusal`).
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import ValidationError

from ..engine.operators import Resolution
from ..errors import ForbiddenError, OperatorError
from ..journal.model import CallIdentity
from .ports import DurableHost, ToolSpec
from .redact import record_view
from .results import dump_result


def operator_payload(value: Any, *, failed: bool, note: str = "") -> bytes:
    """The result bytes an operator's resolution replays (a `CallToolResult` dump).

    `value` may be a whole `CallToolResult` (an object with `content`), any other JSON value
    (sent as text, and as `structuredContent` when it is an object), or None (a short text saying
    an operator resolved the call). Raises `OperatorError` for a malformed `CallToolResult`.
    """
    if isinstance(value, dict) and "content" in value:
        try:
            result = CallToolResult.model_validate(value, by_name=False)
        except ValidationError as exc:
            raise OperatorError(f"the result is not a valid CallToolResult: {exc.errors()[0]['msg']}") from None
        if failed:
            result = result.model_copy(update={"is_error": True})
        return dump_result(result)
    if value is None:
        text = note or ("failed (resolved by an operator)" if failed else "completed (resolved by an operator)")
        return dump_result(CallToolResult(content=[TextContent(type="text", text=text)], is_error=failed))
    import orjson

    structured = value if isinstance(value, dict) else None
    return dump_result(
        CallToolResult(
            content=[TextContent(type="text", text=orjson.dumps(value).decode())],
            structured_content=structured,
            is_error=failed,
        )
    )


def admin_tools(host: DurableHost) -> tuple[ToolSpec, ...]:
    """The admin tools, for `DurableServer` to register when it has admin principals. Each
    refuses (`ForbiddenError`) a caller `host.is_admin` does not accept before reading anything."""

    def require_admin(ctx: Context[Any, Any] | None) -> str:
        principal = host.principal_of(ctx)
        if not host.is_admin(principal):
            raise ForbiddenError(principal)
        return principal

    async def journal_resolve(
        tool: str,
        key: str,
        resolution: Resolution,
        ctx: Context[Any, Any],
        result: Any = None,
        principal: str | None = None,
        note: str = "",
    ) -> dict[str, Any]:
        """Resolve a call in doubt: completed (with the result to replay), failed, or not_applied."""
        caller = require_admin(ctx)
        owner = principal or caller
        if resolution == "completed" and result is None:
            raise OperatorError("resolving as completed needs the result to replay")
        payload = (
            None if resolution == "not_applied" else operator_payload(result, failed=resolution == "failed", note=note)
        )
        record = await host.engine.resolve(
            CallIdentity(owner, tool, key),
            resolution,
            payload=payload,
            note=note or f"by {caller}",
            retention=_retention(host, tool),
            by=caller,
        )
        policy = host.policies.get(tool)
        return record_view(record, policy.sensitive if policy else ())

    async def journal_forget(
        tool: str, key: str, ctx: Context[Any, Any], principal: str | None = None, note: str = ""
    ) -> dict[str, Any]:
        """Forget a call in doubt: its record expires now, so the next call with the key runs anew."""
        caller = require_admin(ctx)
        record = await host.engine.forget(CallIdentity(principal or caller, tool, key), by=caller, note=note)
        policy = host.policies.get(tool)
        return record_view(record, policy.sensitive if policy else ())

    async def journal_cancel(
        tool: str, key: str, ctx: Context[Any, Any], principal: str | None = None, note: str = ""
    ) -> dict[str, Any]:
        """Cancel a running (or in-doubt) call: its tool stops at its owner's next lease renewal or
        durable step, and the call is never resumed (repeats of its key are refused `cancelled`)."""
        caller = require_admin(ctx)
        record = await host.engine.cancel(
            CallIdentity(principal or caller, tool, key), by=caller, note=note, retention=_retention(host, tool)
        )
        policy = host.policies.get(tool)
        return record_view(record, policy.sensitive if policy else ())

    async def journal_rerun(
        tool: str,
        key: str,
        ctx: Context[Any, Any],
        from_step: int | None = None,
        principal: str | None = None,
        note: str = "",
    ) -> dict[str, Any]:
        """Re-run a completed or failed call under a new attempt: the next call with its key runs the
        tool again, replaying durable steps before index `from_step` (None: every step runs again)."""
        caller = require_admin(ctx)
        record = await host.engine.rerun(
            CallIdentity(principal or caller, tool, key),
            from_step=from_step,
            by=caller,
            note=note,
            retention=_retention(host, tool),
        )
        policy = host.policies.get(tool)
        return record_view(record, policy.sensitive if policy else ())

    async def journal_purge_expired(ctx: Context[Any, Any]) -> dict[str, int]:
        """Drop call records whose retention has ended; returns how many were purged."""
        require_admin(ctx)
        return {"purged": await host.engine.purge_expired()}

    operator = ToolAnnotations(destructive_hint=True, idempotent_hint=False, read_only_hint=False)
    return (
        ToolSpec(journal_resolve, "journal_resolve", operator),
        ToolSpec(journal_forget, "journal_forget", operator),
        ToolSpec(journal_rerun, "journal_rerun", operator),
        ToolSpec(journal_cancel, "journal_cancel", operator),
        ToolSpec(journal_purge_expired, "journal_purge_expired", operator.model_copy(update={"idempotent_hint": True})),
    )


def _retention(host: DurableHost, tool: str) -> float | None:
    from ..policy import DEFAULT_RETENTION

    policy = host.policies.get(tool)
    return policy.retention if policy is not None else DEFAULT_RETENTION
