"""Payloads of frames: call records, process entries and purges as orjson documents.

Kinds (field `t`):
- `call`: `{"t":"call","op":"claim"|"swap"|"renew","h":HASH,"r":{record}}`: the whole record
  after the mutation (its latest frame is the record). `h` is the identity's index hash (hex).
- `entry`: `{"t":"entry","process_id":…,"entry_type":…,"data":{…},"ts":…}`; its `seq` is the
  frame's sequence number.
- `purge`: `{"t":"purge","now":…}`: every record with `expires_at <= now` is gone from here on
  (replay applies it at the same point, so one small frame stands for any number of deletions).

The record is `record_json.record_to_json` (the export lines' codec too): bytes fields as text
when they are UTF-8 (a stored MCP result stays readable with `grep`), else base64; `reason` only
when it is set (frames of earlier releases have none and read with `legacy_reason`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from ..base import stored_decoder
from ..model import CallIdentity, CallRecord, JournalEntry
from ..record_json import record_from_json, record_to_json


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


#: The record of a frame's `r` object; a frame that does not decode is a `JournalError`.
record_from_dict = stored_decoder("call record")(record_from_json)


def call_payload(op: str, h: int, record: CallRecord) -> bytes:
    return orjson.dumps({"t": "call", "op": op, "h": f"{h:032x}", "r": record_to_json(record)})


def entry_payload(process_id: str, entry_type: str, data: dict[str, Any], ts: float) -> bytes:
    return orjson.dumps({"t": "entry", "process_id": process_id, "entry_type": entry_type, "data": data, "ts": ts})


def purge_payload(now: float) -> bytes:
    return orjson.dumps({"t": "purge", "now": now})


@stored_decoder("process entry")
def entry_from_dict(d: dict[str, Any], seq: int) -> JournalEntry:
    return JournalEntry(d["process_id"], d["entry_type"], d["data"], d["ts"], seq)
