"""A call record as a JSON object and back: the codec of export lines (`transfer.py`), and of
the file journal's call frames as releases before its compact `c` frames wrote them (`call`
frames, still read: `file/codec.py`). Both are read with it: a change keeps reading what
earlier releases wrote.

Every `CallRecord` field under its own name; the byte fields (`result`, `arguments`) as text
when they are UTF-8 (a stored MCP result stays readable with `grep`), else base64 under
`result_b64` / `arguments_b64`, so every record round-trips byte for byte. `task_id` is
written only on tasks, `reason` only when it is not None (frames and exports of earlier releases
read the same). A record without `reason` (written before the field existed, or whose reason is
None) reads back with `legacy_reason(state, error)`: None for PENDING, COMPLETED and FAILED, the
reason its error text names for RELEASED and IN_DOUBT.

Also here, since every backend applies it to the JSON data of process entries: `step_index`,
what makes an entry step `index` of its process (the uniqueness `Journal.append_step` keeps),
and `step_data`, the data `append_step` writes.
"""

from __future__ import annotations

import base64
from typing import Any

from .base import STEP
from .model import CallIdentity, CallRecord, CallState, Reason, legacy_reason

BYTES_FIELDS = ("result", "arguments")
#: Step indexes are 64-bit signed integers (what every backend's index can hold).
STEP_INDEX_MIN, STEP_INDEX_MAX = -(1 << 63), (1 << 63) - 1


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
        "principal": i.principal,
        "tool": i.tool,
        "key": i.key,
        "fingerprint": record.fingerprint,
        "state": record.state.value,
        "version": record.version,
        "run_id": record.run_id,
        "attempts": record.attempts,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "owner": record.owner,
        "lease_until": record.lease_until,
        "completed_at": record.completed_at,
        "expires_at": record.expires_at,
        "error": record.error,
    }
    for name in BYTES_FIELDS:
        _bytes_out(out, name, getattr(record, name))
    if record.task_id is not None:
        out["task_id"] = record.task_id
    if record.reason is not None:
        out["reason"] = record.reason.value
    return out


def record_from_json(d: dict[str, Any]) -> CallRecord:
    """The record of a JSON object written by `record_to_json` (by this release or an earlier
    one: without `reason`, the record's is `legacy_reason`). Raises `KeyError`, `ValueError`
    or `TypeError` when it is not one (callers map these to their own errors)."""
    state, error = CallState(d["state"]), d.get("error")
    stored_reason = d.get("reason")
    return CallRecord(
        identity=CallIdentity(str(d["principal"]), str(d["tool"]), str(d["key"])),
        fingerprint=str(d["fingerprint"]),
        state=state,
        version=int(d["version"]),
        run_id=str(d["run_id"]),
        attempts=int(d["attempts"]),
        created_at=float(d["created_at"]),
        updated_at=float(d["updated_at"]),
        owner=d.get("owner"),
        lease_until=d.get("lease_until"),
        completed_at=d.get("completed_at"),
        expires_at=d.get("expires_at"),
        result=_bytes_in(d, "result"),
        error=error,
        arguments=_bytes_in(d, "arguments"),
        task_id=d.get("task_id"),
        reason=legacy_reason(state, error) if stored_reason is None else Reason(stored_reason),
    )


def step_index(entry_type: str, data: Any) -> int | None:
    """The step index of a process entry: `data["index"]` when the entry is a `STEP` whose index
    is a 64-bit integer, else None (not a step `append_step` could collide with)."""
    if entry_type != STEP or not isinstance(data, dict):
        return None
    index = data.get("index")
    if type(index) is not int or not STEP_INDEX_MIN <= index <= STEP_INDEX_MAX:
        return None
    return index


def step_data(index: int, data: dict[str, Any]) -> dict[str, Any]:
    """The data `append_step` writes for step `index`: `data` with `"index": index` (a copy when
    it was absent; `data` itself is never changed). Raises `ValueError` when `index` is not a
    64-bit integer or `data` holds another index."""
    if type(index) is not int or not STEP_INDEX_MIN <= index <= STEP_INDEX_MAX:
        raise ValueError(f"a step index is a 64-bit integer, not {index!r}")
    if "index" not in data:
        return {**data, "index": index}
    if step_index(STEP, data) != index:
        raise ValueError(f"step {index}'s data holds another index: {data['index']!r}")
    return data
