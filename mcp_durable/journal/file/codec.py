"""Payloads of frames: call records, process entries and purges as orjson documents.

Kinds (field `t`):
- `call`: `{"t":"call","op":"claim"|"swap"|"renew","h":HASH,"r":{record}}`: the whole record
  after the mutation (its latest frame is the record). `h` is the identity's index hash (hex).
- `entry`: `{"t":"entry","process_id":…,"entry_type":…,"data":{…},"ts":…}`; its `seq` is the
  frame's sequence number.
- `purge`: `{"t":"purge","now":…}`: every record with `expires_at <= now` is gone from here on
  (replay applies it at the same point, so one small frame stands for any number of deletions).

Bytes fields (`result`, `arguments`) are stored as text when they are UTF-8 (a stored MCP
result stays readable with `grep`), else base64 under `result_b64` / `arguments_b64`.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import orjson

from ..base import stored_decoder
from ..model import CallIdentity, CallRecord, CallState, JournalEntry

_BYTES_FIELDS = ("result", "arguments")


def identity_hash(key: bytes, identity: CallIdentity) -> int:
    """The 128-bit keyed BLAKE2b of an identity: what the in-memory index is keyed by.

    Keyed with the journal's own random key (in the manifest), so nobody can craft keys that
    collide; 128 bits make an accidental collision far rarer than a disk error, and every read
    still compares the full identity.
    """
    raw = "\x00".join((identity.principal, identity.tool, identity.key)).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(raw, digest_size=16, key=key).digest(), "little")


def process_hash(process_id: str) -> int:
    """A 64-bit hash of a process id (collisions are harmless: entries are checked on read)."""
    digest = hashlib.blake2b(process_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def record_to_dict(record: CallRecord) -> dict[str, Any]:
    i = record.identity
    out: dict[str, Any] = {
        "principal": i.principal, "tool": i.tool, "key": i.key, "fingerprint": record.fingerprint,
        "state": record.state.value, "version": record.version, "run_id": record.run_id,
        "attempts": record.attempts, "created_at": record.created_at, "updated_at": record.updated_at,
        "owner": record.owner, "lease_until": record.lease_until, "completed_at": record.completed_at,
        "expires_at": record.expires_at, "error": record.error,
    }
    for name in _BYTES_FIELDS:
        value: bytes | None = getattr(record, name)
        if value is None:
            out[name] = None
            continue
        try:
            out[name] = value.decode("utf-8")
        except UnicodeDecodeError:
            out[f"{name}_b64"] = base64.b64encode(value).decode("ascii")
    if record.task_id is not None:
        out["task_id"] = record.task_id  # absent on plain calls: frames of older releases read the same
    return out


@stored_decoder("call record")
def record_from_dict(d: dict[str, Any]) -> CallRecord:
    blobs: dict[str, bytes | None] = {}
    for name in _BYTES_FIELDS:
        text = d.get(name)
        if text is not None:
            blobs[name] = text.encode("utf-8")
        elif (b64 := d.get(f"{name}_b64")) is not None:
            blobs[name] = base64.b64decode(b64)
        else:
            blobs[name] = None
    return CallRecord(
        identity=CallIdentity(d["principal"], d["tool"], d["key"]),
        fingerprint=d["fingerprint"], state=CallState(d["state"]), version=d["version"],
        run_id=d["run_id"], attempts=d["attempts"], created_at=d["created_at"],
        updated_at=d["updated_at"], owner=d["owner"], lease_until=d["lease_until"],
        completed_at=d["completed_at"], expires_at=d["expires_at"], result=blobs["result"],
        error=d["error"], arguments=blobs["arguments"], task_id=d.get("task_id"),
    )


def call_payload(op: str, h: int, record: CallRecord) -> bytes:
    return orjson.dumps({"t": "call", "op": op, "h": f"{h:032x}", "r": record_to_dict(record)})


def entry_payload(process_id: str, entry_type: str, data: dict[str, Any], ts: float) -> bytes:
    return orjson.dumps({"t": "entry", "process_id": process_id, "entry_type": entry_type, "data": data, "ts": ts})


def purge_payload(now: float) -> bytes:
    return orjson.dumps({"t": "purge", "now": now})


@stored_decoder("process entry")
def entry_from_dict(d: dict[str, Any], seq: int) -> JournalEntry:
    return JournalEntry(d["process_id"], d["entry_type"], d["data"], d["ts"], seq)
