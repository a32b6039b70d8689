"""What an operator or agent may see of a call record: one JSON view, with sensitive values masked.

No `mcp` import: the operator CLI (`mcp-durable journal …`) prints these views without loading
the MCP face; `mcp_durable.server.redact` re-exports them for the face.

Every journal resource and every line of `mcp-durable journal` output goes through `record_view`,
so redaction is decided in one place. The journal itself keeps everything replay needs (the
stored result is replayed byte-identical to the caller who owns it); only views are masked.

Which values are sensitive is per tool (`ToolPolicy.sensitive`): argument names whose values are
masked wherever they appear at the top level of the arguments and anywhere in the result's
`structuredContent`; the name `"*result*"` masks the whole result. A server journals its tools'
sensitive names (see `SensitiveNames`) so the CLI, which only has a journal URL, masks the same.

Journal URLs are masked elsewhere, below the face (no `mcp` import): `journal.display_url`
(`mcp_durable/journal/masked_urls.py`) is the one function every printed or logged URL goes through.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

import orjson

from .journal.base import Journal
from .journal.model import CallRecord, CallState, JournalEntry
from .policy import ToolPolicy
from .tasks import task_view
from .uris import record_uri

MASK = "[redacted]"
RESULT_MARK = "*result*"
#: The process under which servers journal their tools' sensitive names (one checkpoint, merged).
REDACTION_PROCESS = "mcp-durable/redaction"

Sensitive = Mapping[str, Collection[str]]  # tool name -> sensitive argument names


def iso(ts: float | None) -> str | None:
    """Epoch seconds as ISO 8601 UTC (`2026-11-29T08:00:00.123456Z`), None stays None: exactly
    `datetime.fromtimestamp(ts, UTC).isoformat()` with "Z" for "+00:00".

    Every durable answer's `_meta` carries one (`server/results.py`), so this is on every call's
    path: the whole seconds are formatted once per second and the microseconds added to them,
    rather than a `datetime` built per call (docs/dev/performance-notebook.md). The microseconds
    are rounded as `datetime.fromtimestamp` rounds them (half to even, carried into the next
    second).
    """
    if ts is None:
        return None
    fraction, whole = math.modf(ts)
    micros = round(fraction * 1e6)
    if micros >= 1_000_000:
        whole, micros = whole + 1.0, micros - 1_000_000
    elif micros < 0:  # before 1970: modf keeps the sign
        whole, micros = whole - 1.0, micros + 1_000_000
    prefix = _whole_second(int(whole))
    return f"{prefix}.{micros:06d}Z" if micros else f"{prefix}Z"


@lru_cache(maxsize=64)  # the calls of one second share its text
def _whole_second(second: int) -> str:
    return datetime.fromtimestamp(second, UTC).isoformat()[:-6]  # without "+00:00"


def _json_or_text(payload: bytes | None) -> Any:
    if payload is None:
        return None
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return payload.decode("utf-8", "replace")


def _mask_deep(value: Any, names: Collection[str]) -> Any:
    if isinstance(value, dict):
        return {k: MASK if k in names else _mask_deep(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_deep(v, names) for v in value]
    return value


def mask_arguments(arguments: Any, names: Collection[str]) -> Any:
    """The arguments with the values of sensitive top-level names replaced by `MASK`."""
    if not names or not isinstance(arguments, dict):
        return arguments
    return {k: MASK if k in names else v for k, v in arguments.items()}


def mask_result(result: Any, names: Collection[str]) -> Any:
    """A stored result (a `CallToolResult` dump) as it may be shown.

    `"*result*"` masks it entirely; otherwise sensitive names are masked anywhere in
    `structuredContent` and in JSON text contents (the SDK mirrors structured output as text).
    """
    if result is None or not names:
        return result
    if RESULT_MARK in names:
        return MASK
    if not isinstance(result, dict):
        return result
    shown = dict(result)
    if "structuredContent" in shown:
        shown["structuredContent"] = _mask_deep(shown["structuredContent"], names)
    content = shown.get("content")
    if isinstance(content, list):
        shown["content"] = [_mask_text_block(block, names) for block in content]
    return shown


def _mask_text_block(block: Any, names: Collection[str]) -> Any:
    if not (isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)):
        return block
    try:
        parsed = orjson.loads(block["text"])
    except orjson.JSONDecodeError:
        return block
    masked = _mask_deep(parsed, names)
    if masked == parsed:
        return block
    return {**block, "text": orjson.dumps(masked).decode()}


def sensitive_values(arguments: Any, names: Collection[str]) -> list[str]:
    """The values of the sensitive arguments (4+ characters), longest first. A secret is masked
    wherever it appears in a view (a result's free text, an error message), not only under its name."""
    if not names or not isinstance(arguments, dict):
        return []
    found = {
        str(v) for k, v in arguments.items() if k in names and isinstance(v, str | int) and not isinstance(v, bool)
    }
    return sorted((v for v in found if len(v) >= 4), key=len, reverse=True)


def scrub(value: Any, secrets: Collection[str]) -> Any:
    """`value` with every occurrence of each secret in its strings replaced by `MASK`."""
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, MASK)
        return value
    if isinstance(value, dict):
        return {k: scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, secrets) for v in value]
    return value


def task_status(record: CallRecord, policies: Mapping[str, ToolPolicy] | None) -> str | None:
    """The MCP task status of a record that is a task (None: a plain call).

    `policies` are the server's tools' (an in-doubt task's status depends on its policy); the
    CLI, which has only the journal, passes None and sees an in-doubt task as `in_doubt`.
    """
    if record.task_id is None:
        return None
    if policies is None and record.state == CallState.IN_DOUBT:
        return "in_doubt"
    return task_view(record, (policies or {}).get(record.identity.tool)).status


def record_summary(record: CallRecord, policies: Mapping[str, ToolPolicy] | None = None) -> dict[str, Any]:
    """A record's listing line: identity, state, whether it is an MCP task (and its status), times;
    without arguments or result."""
    i = record.identity
    return {
        "uri": record_uri(i.tool, i.key),
        "principal": i.principal,
        "tool": i.tool,
        "key": i.key,
        "state": record.state.value,
        "task": record.task_id is not None,
        "task_status": task_status(record, policies),
        "attempts": record.attempts,
        "created_at": iso(record.created_at),
        "updated_at": iso(record.updated_at),
        "completed_at": iso(record.completed_at),
    }


def record_view(
    record: CallRecord, sensitive: Collection[str] = (), policies: Mapping[str, ToolPolicy] | None = None
) -> dict[str, Any]:
    """The full view of one record (what `journal://calls/{tool}/{key}` and `journal show` print)."""
    view = record_summary(record, policies)
    arguments = _json_or_text(record.arguments)
    secrets = sensitive_values(arguments, sensitive)
    view.update(
        {
            "fingerprint": record.fingerprint,
            "version": record.version,
            "run_id": record.run_id,
            "task_id": record.task_id,
            "owner": record.owner,
            "lease_until": iso(record.lease_until),
            "expires_at": iso(record.expires_at),
            "arguments": mask_arguments(arguments, sensitive),
            "result": scrub(mask_result(_json_or_text(record.result), sensitive), secrets),
            "error": scrub(record.error, secrets),
        }
    )
    return view


def steps_view(
    record: CallRecord, steps: Collection[JournalEntry], sensitive: Collection[str] = ()
) -> list[dict[str, Any]]:
    """A call's durable steps as they may be shown: index, name, time and result, the result
    masked like the call's result (sensitive names anywhere, the arguments' secret values)."""
    secrets = sensitive_values(_json_or_text(record.arguments), sensitive)
    hidden = RESULT_MARK in sensitive
    return [
        {
            "index": step.data.get("index"),
            "name": step.data.get("name"),
            "at": iso(step.ts),
            "result": MASK if hidden else scrub(_mask_deep(step.data.get("result"), sensitive), secrets),
        }
        for step in steps
    ]


class SensitiveNames:
    """The sensitive names per tool, journaled so readers without the server (the CLI) mask alike.

    Stored as one checkpoint of the process `REDACTION_PROCESS`: `{"context_state": {"tools":
    {tool: [names]}}}`. `publish` merges this server's tools into what the journal holds, so
    several servers sharing a journal add up; it writes only when something changed.
    """

    @staticmethod
    async def load(journal: Journal) -> dict[str, tuple[str, ...]]:
        checkpoint = await journal.last_checkpoint(REDACTION_PROCESS)
        if checkpoint is None:
            return {}
        tools = checkpoint.data.get("context_state", {}).get("tools", {})
        return {str(t): tuple(str(n) for n in names) for t, names in tools.items() if isinstance(names, list)}

    @staticmethod
    async def publish(journal: Journal, tools: Sensitive, now: float) -> bool:
        """Merge `tools` into the journaled names; returns whether anything was written."""
        current = await SensitiveNames.load(journal)
        merged = dict(current)
        for tool, names in tools.items():
            if names:
                merged[tool] = tuple(sorted(set(names)))
        if merged == current:
            return False
        data = {"context_state": {"tools": {t: list(n) for t, n in sorted(merged.items())}}, "lifecycle_state": None}
        await journal.append(REDACTION_PROCESS, "checkpoint", data, now)
        return True
