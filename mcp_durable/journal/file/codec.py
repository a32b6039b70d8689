"""Payloads of frames: call records, process entries and purges as orjson documents.

Kinds (field `t`):
- `c`: `{"t":"c","r":[…]}`: a call record, the whole record after a claim, swap or renewal (the
  latest frame of an identity is the record), positionally (`RECORD_LAYOUT`, below).
- `call` (written by earlier releases, still read): `{"t":"call","op":…,"h":HASH,"r":{record}}`,
  the record as `record_json.record_to_json` writes it (the export lines' codec), with the
  operation and the identity's index hash (hex) beside it.
- `entry`: `{"t":"entry","process_id":…,"entry_type":…,"data":{…},"ts":…}`; its `seq` is the
  frame's sequence number.
- `purge`: `{"t":"purge","now":…}`: every record with `expires_at <= now` is gone from here on
  (replay applies it at the same point, so one small frame stands for any number of deletions).

A `c` frame stores nothing twice and nothing that can be recomputed: no field names, no
operation (the version and state tell), no index hash (recovery computes it from the identity
and the manifest's `hash_key`), no key when it is the one derived from the fingerprint, times as
whole seconds after another (a lease, a retention, the same instant), hex digests as their
bytes in base64, result and arguments as the JSON they are (no quotes escaped). Every record
round-trips exactly, whatever its values: each shortening is taken only when decoding gives the
very value back, and otherwise the plain form is written.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import math
from typing import Any

import orjson

from ..base import stored_decoder
from ..model import CallIdentity, CallRecord, CallState, JournalEntry, Reason
from ..record_json import record_from_json

#: The positions of a `c` frame's record array; trailing nulls are left out.
#:
#: - `key`: the key, or `0` for the key derived from the fingerprint (`"sha256:" + fingerprint`);
#: - `fingerprint`, `run_id`: the string, or `[s]` for one in lower-case hex: `s` is the bytes
#:   it spells in base64, unpadded;
#: - `state`: its index in `STATES`;
#: - a time: a number, null, or `[d]`: `d` (whole) seconds after its base (`updated_at` after
#:   `created_at`, the others after `updated_at`);
#: - `arguments`, `result`: null, a string (the bytes are that text in UTF-8), an object (the
#:   bytes are that JSON, exactly as orjson writes it), or `[s]` (the bytes in base64);
#: - `reason`: a `Reason` value or null.
RECORD_LAYOUT = (
    "principal",
    "tool",
    "key",
    "fingerprint",
    "state",
    "version",
    "run_id",
    "attempts",
    "created_at",
    "updated_at",
    "arguments",
    "owner",
    "lease_until",
    "completed_at",
    "expires_at",
    "result",
    "error",
    "task_id",
    "reason",
)
#: The state codes of `c` frames (part of the format: never reordered, only appended to).
STATES = (CallState.PENDING, CallState.COMPLETED, CallState.FAILED, CallState.IN_DOUBT, CallState.RELEASED)
_STATE_CODE = {state: code for code, state in enumerate(STATES)}
_STATE_OF_CODE = dict(enumerate(STATES))
_REQUIRED = RECORD_LAYOUT.index("updated_at") + 1  # the fields a record array always has
_DERIVED_PREFIX = "sha256:"
#: Bytes up to this size are stored as the JSON they are (when they are canonical orjson JSON):
#: checking costs a parse and a dump on write, and reading one a parse and a dump, so a large
#: result (whose escaped quotes are a smaller share of it anyway) stays text, read at string speed.
EMBED_MAX = 16 * 1024
#: How many recent encodings of a hex digest, and of arguments of up to `RECENT_ARGUMENTS_MAX`
#: bytes, are kept: a record's completion, renewal or release writes the fingerprint, run id and
#: arguments its claim wrote, and finds them here while the calls in flight number fewer.
RECENT = 1024
RECENT_ARGUMENTS_MAX = 1024


def identity_hash(key: bytes, identity: CallIdentity) -> int:
    """The 128-bit keyed BLAKE2b of an identity: what the in-memory index is keyed by (it keeps
    80 bits of it, `index.HASH_MASK`).

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


# -- call records ---------------------------------------------------------------------------------


def call_payload(record: CallRecord) -> bytes:
    """The `c` frame payload of `record`."""
    return orjson.dumps({"t": "c", "r": record_to_list(record)})


def record_to_list(record: CallRecord) -> list[Any]:
    """The record array of a `c` frame (`RECORD_LAYOUT`)."""
    i, created, updated = record.identity, record.created_at, record.updated_at
    out: list[Any] = [
        i.principal,
        i.tool,
        0 if i.key == _DERIVED_PREFIX + record.fingerprint else i.key,
        _hex_out(record.fingerprint),
        _STATE_CODE[record.state],
        record.version,
        _hex_out(record.run_id),
        record.attempts,
        created,
        _time_out(updated, created),
        _arguments_out(record.arguments),
        record.owner,
        _time_out(record.lease_until, updated),
        _time_out(record.completed_at, updated),
        _time_out(record.expires_at, updated),
        _bytes_out(record.result),
        record.error,
        record.task_id,
        None if record.reason is None else record.reason.value,
    ]
    end = len(out)
    while out[end - 1] is None:
        end -= 1
    del out[end:]
    return out


def record_from_list(r: list[Any]) -> CallRecord:
    """The record of a `c` frame's array; raises `ValueError`, `TypeError` or `KeyError` when
    it is not one (an unknown state or reason, a missing or mistyped field)."""
    if len(r) < _REQUIRED:
        raise ValueError(f"a record array has at least {_REQUIRED} fields, not {len(r)}")
    r = r + [None] * (len(RECORD_LAYOUT) - len(r))
    principal, tool, key, fingerprint = _text(r[0]), _text(r[1]), r[2], _hex_in(r[3])
    created = _number(r[8])
    updated = _number(_time_in(r[9], created))
    return CallRecord(
        identity=CallIdentity(principal, tool, _key(key, fingerprint)),
        fingerprint=fingerprint,
        state=STATES[_code(r[4])],
        version=_integer(r[5]),
        run_id=_hex_in(r[6]),
        attempts=_integer(r[7]),
        created_at=created,
        updated_at=updated,
        owner=_optional_text(r[11]),
        lease_until=_time_in(r[12], updated),
        completed_at=_time_in(r[13], updated),
        expires_at=_time_in(r[14], updated),
        result=_bytes_in(r[15]),
        error=_optional_text(r[16]),
        arguments=_bytes_in(r[10]),
        task_id=_optional_text(r[17]),
        reason=None if r[18] is None else Reason(r[18]),
    )


def index_fields(r: list[Any]) -> tuple[CallIdentity, int, CallState, float, float | None, str | None]:
    """What recovery's index needs of a `c` frame's array, without decoding its bytes:
    `(identity, version, state, created_at, expires_at, task_id)`. Raises `ValueError`,
    `TypeError` or `KeyError` on a malformed identity, state, version or time (the rest of the
    record is checked where it is read: `record_from_list`, `verify`)."""
    n = len(r)
    if n < _REQUIRED:
        raise ValueError(f"a record array has at least {_REQUIRED} fields, not {n}")
    # Run once per frame at recovery: the checks inline, the fingerprint decoded only when the
    # key is derived from it.
    principal, tool, key, version, created = r[0], r[1], r[2], r[5], r[8]
    if type(key) is int and key == 0:
        key = _DERIVED_PREFIX + _hex_in(r[3])
    if type(principal) is not str or type(tool) is not str or type(key) is not str:
        raise TypeError("a record's principal, tool and key are strings")
    if type(version) is not int:
        raise TypeError(f"expected an integer version, not {type(version).__name__}")
    if type(created) is not float and type(created) is not int:
        raise TypeError(f"expected a number, not {type(created).__name__}")
    updated = _time_in(r[9], created)
    expires = _time_in(r[14], updated) if n > 14 else None
    task_id = _optional_text(r[17]) if n > 17 else None
    return CallIdentity(principal, tool, key), version, _STATE_OF_CODE[r[4]], created, expires, task_id


def _stored_record(r: Any) -> CallRecord:
    # `c` frames hold an array, frames of earlier releases (`call`) an object.
    return record_from_list(r) if isinstance(r, list) else record_from_json(r)


#: The record of a frame's `r` (either kind); a frame that does not decode is a `JournalError`.
record_from_dict = stored_decoder("call record")(_stored_record)


@functools.lru_cache(maxsize=RECENT)
def _hex_out(value: str) -> Any:
    """`value` as `[base64]` of the bytes it spells when it is lower-case hex (a SHA-256 digest,
    a run id: 32 bytes in 43 characters, not 64), else itself. A tuple (orjson writes it as an
    array), as the recent ones are shared."""
    if len(value) < 16 or len(value) % 2:
        return value
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        return value
    if raw.hex() != value:  # upper case or spaces: not what decoding gives back
        return value
    return (binascii.b2a_base64(raw, newline=False).rstrip(b"=").decode("ascii"),)


def _hex_in(value: Any) -> str:
    if type(value) is list and len(value) == 1 and type(value[0]) is str:
        text = value[0]
        return binascii.a2b_base64(text + "=" * (-len(text) % 4), strict_mode=True).hex()
    return _text(value)


def _time_out(value: float | None, base: float) -> Any:
    """`value` as `[d]`, `d` whole seconds after `base` (a lease, a retention, the same time),
    when adding them gives `value` back exactly; else itself. Whole seconds only: they are what
    the engine adds (no decimals to write) and the only offsets sure to be shorter."""
    if type(value) is float and type(base) is float:
        d = value - base
        # Whole and finite (is_integer is False for infinities and NaN), and exact as an int.
        if d.is_integer() and -_EXACT < d < _EXACT:
            n = int(d)
            back = base + n
            # Not rounded on the way, and not a zero of the other sign.
            if back == value and (value != 0.0 or math.copysign(1.0, value) == math.copysign(1.0, back)):
                return (n,)
    return value


#: The magnitude below which every whole float is an exact int (2^53).
_EXACT = float(2**53)


def _time_in(value: Any, base: float) -> Any:
    if type(value) is list:
        if len(value) != 1:
            raise ValueError(f"a relative time is [seconds], not {value!r}")
        return base + _number(value[0])
    return None if value is None else _number(value)


def _bytes_out(value: bytes | None) -> Any:
    """`value` as a bytes slot: the JSON object it is, its text, or `[base64]`."""
    if value is None:
        return None
    if value[:1] == b"{" and len(value) <= EMBED_MAX:
        try:
            parsed = orjson.loads(value)
        except orjson.JSONDecodeError:
            pass
        else:
            # Kept as JSON only when reading it back writes these very bytes (no spaces, escapes,
            # repeated keys or float spellings of other writers), so the bytes round-trip; being
            # orjson's own output, they hold no raw newline either (a frame is one line).
            if type(parsed) is dict and orjson.dumps(parsed) == value:
                return orjson.Fragment(value)
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return [base64.b64encode(value).decode("ascii")]


def _arguments_out(value: bytes | None) -> Any:
    """`_bytes_out` of a record's arguments, the recent small ones' kept (`RECENT`)."""
    if type(value) is bytes and len(value) <= RECENT_ARGUMENTS_MAX:  # hashable: bytes only
        return _recent_bytes_out(value)
    return _bytes_out(value)


_recent_bytes_out = functools.lru_cache(maxsize=RECENT)(_bytes_out)


def _bytes_in(value: Any) -> bytes | None:
    if value is None:
        return None
    if type(value) is str:
        return value.encode("utf-8")
    if type(value) is dict:
        return orjson.dumps(value)
    if type(value) is list and len(value) == 1 and type(value[0]) is str:
        return base64.b64decode(value[0], validate=True)
    raise TypeError(f"not a stored bytes value: {type(value).__name__}")


def _key(value: Any, fingerprint: str) -> str:
    return _DERIVED_PREFIX + fingerprint if type(value) is int and value == 0 else _text(value)


def _text(value: Any) -> str:
    if type(value) is not str:
        raise TypeError(f"expected a string, not {type(value).__name__}")
    return value


def _optional_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _integer(value: Any) -> int:
    if type(value) is not int:
        raise TypeError(f"expected an integer, not {type(value).__name__}")
    return value


def _number(value: Any) -> float:
    if type(value) is not float and type(value) is not int:
        raise TypeError(f"expected a number, not {type(value).__name__}")
    return value


def _code(value: Any) -> int:
    code = _integer(value)
    if not 0 <= code < len(STATES):
        raise ValueError(f"unknown state code {code}")
    return code


# -- process entries and purges ---------------------------------------------------------------------


def entry_payload(process_id: str, entry_type: str, data: dict[str, Any], ts: float) -> bytes:
    return orjson.dumps({"t": "entry", "process_id": process_id, "entry_type": entry_type, "data": data, "ts": ts})


def purge_payload(now: float) -> bytes:
    return orjson.dumps({"t": "purge", "now": now})


@stored_decoder("process entry")
def entry_from_dict(d: dict[str, Any], seq: int) -> JournalEntry:
    return JournalEntry(d["process_id"], d["entry_type"], d["data"], d["ts"], seq)
