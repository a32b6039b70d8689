"""A call record as a JSON object and back: the one codec of the file journal's frames
(`file/codec.py`) and of export lines (`transfer.py`).

Every `CallRecord` field under its own name; the byte fields (`result`, `arguments`) as text
when they are UTF-8 (a stored MCP result stays readable with `grep`), else base64 under
`result_b64` / `arguments_b64`, so every record round-trips byte for byte. `task_id` is
written only on tasks (frames and exports of earlier releases read the same).
"""

from __future__ import annotations

import base64
from typing import Any

from .model import CallIdentity, CallRecord, CallState

BYTES_FIELDS = ("result", "arguments")


def _bytes_out(out: dict[str, Any], name: str, value: bytes | None) -> None:
    if value is None:
        out[name] = None
        return
    try:
        out[name] = value.decode("utf-8")
    except UnicodeDecodeError:
        out[f"{name}_b64"] = base64.b64encode(value).decode("ascii")


def _bytes_in(d: dict[str, Any], name: str) -> bytes | None:
    if (b64 := d.get(f"{name}_b64")) is not None:
        return base64.b64decode(b64)
    value = d.get(name)
    return None if value is None else str(value).encode("utf-8")


def record_to_json(record: CallRecord) -> dict[str, Any]:
    """The record as a JSON object (see the module docstring)."""
    i = record.identity
    out: dict[str, Any] = {
        "principal": i.principal, "tool": i.tool, "key": i.key, "fingerprint": record.fingerprint,
        "state": record.state.value, "version": record.version, "run_id": record.run_id,
        "attempts": record.attempts, "created_at": record.created_at, "updated_at": record.updated_at,
        "owner": record.owner, "lease_until": record.lease_until, "completed_at": record.completed_at,
        "expires_at": record.expires_at, "error": record.error,
    }
    for name in BYTES_FIELDS:
        _bytes_out(out, name, getattr(record, name))
    if record.task_id is not None:
        out["task_id"] = record.task_id
    return out


def record_from_json(d: dict[str, Any]) -> CallRecord:
    """The record of a JSON object written by `record_to_json`. Raises `KeyError`, `ValueError`
    or `TypeError` when it is not one (callers map these to their own errors)."""
    return CallRecord(
        identity=CallIdentity(str(d["principal"]), str(d["tool"]), str(d["key"])),
        fingerprint=str(d["fingerprint"]), state=CallState(d["state"]), version=int(d["version"]),
        run_id=str(d["run_id"]), attempts=int(d["attempts"]), created_at=float(d["created_at"]),
        updated_at=float(d["updated_at"]), owner=d.get("owner"), lease_until=d.get("lease_until"),
        completed_at=d.get("completed_at"), expires_at=d.get("expires_at"), result=_bytes_in(d, "result"),
        error=d.get("error"), arguments=_bytes_in(d, "arguments"), task_id=d.get("task_id"),
    )
