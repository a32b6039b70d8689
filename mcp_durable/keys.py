"""Idempotency keys: resolution, validation, canonical JSON and fingerprints. Pure, no I/O.

Resolution order for a call (DESIGN.md §2):
  1. the caller's key in `_meta["mcp-durable/idempotency-key"]`;
  2. the tool's declared key argument (e.g. `idempotency_key`), when the caller filled it;
  3. the tool's key fields (e.g. `order_id`) or key function over the arguments;
  4. for a tool registered idempotent: derived from the whole canonical argument object.
A call that reaches none of these has no key (`None`): it runs, but is not deduplicated.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

from .errors import InvalidKeyError, MissingKeyError
from .policy import ToolPolicy

#: The principal of every call without an authenticated identity (stdio, in-memory, no auth).
LOCAL_PRINCIPAL = "local"

KEY_META = "mcp-durable/idempotency-key"
MAX_KEY_LENGTH = 255


def canonical_json(value: Any) -> bytes:
    """The canonical JSON of `value`: sorted keys, no insignificant whitespace, UTF-8."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)


def fingerprint(arguments: Mapping[str, Any], *, canonical: bytes | None = None) -> str:
    """SHA-256 (hex) of the canonical JSON of the validated arguments (`canonical`, when the
    caller has it already: it must be `canonical_json(arguments)`)."""
    return hashlib.sha256(canonical if canonical is not None else canonical_json(dict(arguments))).hexdigest()


def validate_key(tool: str, key: object) -> str:
    """Return `key` if it is 1–255 printable ASCII characters; raise `InvalidKeyError` otherwise."""
    if not isinstance(key, str):
        raise InvalidKeyError(tool, f"the key must be a string, not {type(key).__name__}")
    if not key:
        raise InvalidKeyError(tool, "the key is empty")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKeyError(tool, f"the key has {len(key)} characters; at most {MAX_KEY_LENGTH} are allowed")
    if key.isascii() and key.isprintable():  # the common case, in C: ASCII printable is " " to "~"
        return key
    for position, char in enumerate(key):
        if not " " <= char <= "~":
            raise InvalidKeyError(
                tool, f"character {position} ({char!r}) is not printable ASCII (control or non-ASCII characters)"
            )
    return key


def _hashed(prefix: str, value: Any) -> str:
    return f"{prefix}:" + hashlib.sha256(canonical_json(value)).hexdigest()


def _key_from_fields(policy: ToolPolicy, tool: str, arguments: Mapping[str, Any]) -> str:
    fields = policy.key_fields or ()
    missing = [name for name in fields if name not in arguments]
    if missing:
        raise InvalidKeyError(tool, f"key field(s) {', '.join(missing)} missing from the arguments")
    if len(fields) == 1:
        # A single readable field (an order id) is the key itself, so operators can find
        # `journal://calls/refund/O-1`; anything else is hashed into a valid key.
        value = arguments[fields[0]]
        if isinstance(value, str | int) and not isinstance(value, bool):
            text = str(value)
            try:
                return validate_key(tool, text)
            except InvalidKeyError:
                pass
    return _hashed("fields", {name: arguments[name] for name in fields})


def resolve_key(
    policy: ToolPolicy,
    tool: str,
    arguments: Mapping[str, Any],
    meta: Mapping[str, Any] | None,
    *,
    canonical: bytes | None = None,
    fingerprint_hex: str | None = None,
) -> str | None:
    """The call's key by the resolution order above, validated; `None` when the call has none.

    `canonical` is `canonical_json(arguments)` when the caller has computed it already (a
    derived key is its SHA-256, like the fingerprint, so it is not serialised twice), and
    `fingerprint_hex` is `fingerprint(arguments)` when the caller has that (not hashed twice).

    Raises `MissingKeyError` when the policy requires a caller key and none was sent, and
    `InvalidKeyError` for a key that is not 1–255 printable ASCII characters.
    """
    if meta is not None and KEY_META in meta:
        return validate_key(tool, meta[KEY_META])
    if policy.key_argument is not None:
        supplied = arguments.get(policy.key_argument)
        if supplied is not None:
            return validate_key(tool, supplied)
    if policy.key == "required":
        raise MissingKeyError(tool)
    if policy.key_fn is not None:
        return validate_key(tool, policy.key_fn(dict(arguments)))
    if policy.key_fields:
        return _key_from_fields(policy, tool, arguments)
    if policy.idempotent:
        # == _hashed("sha256", arguments)
        return "sha256:" + (fingerprint_hex or fingerprint(arguments, canonical=canonical))
    return None
