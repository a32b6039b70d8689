"""Idempotency keys: resolution, validation, canonical JSON and fingerprints. Pure, no I/O.

Resolution order for a call (docs/policies.md, "Keys"):
  1. the caller's key in `_meta["mcp-durable/idempotency-key"]`, else under the policy's
     `key_meta` names, in order;
  2. the tool's declared key argument (e.g. `idempotency_key`), when the caller filled it;
  3. the tool's key fields (e.g. `order_id`) or key function over the arguments;
  4. under `key="derived"` only: derived from the whole canonical argument object (never by
     default: equal arguments are not always one effect; docs/policies.md, "Keys").
A call that reaches none of these has no key (`None`): it runs, but is not deduplicated. An
interactive tool (`ToolPolicy.interactive`) stops after 2: its key is never derived.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import orjson

from .errors import InvalidKeyError, MissingKeyError
from .policy import ToolPolicy

#: The principal of every call without an authenticated identity (stdio, in-memory, no auth).
LOCAL_PRINCIPAL = "local"

KEY_META = "mcp-durable/idempotency-key"
MAX_KEY_LENGTH = 255


def token_principal(client_id: str, subject: str | None, issuer: Any) -> str:
    """The principal of a call made with an authenticated token: its client id, its subject unless
    that is the client id (a static token map's principal is not repeated: `alice`), its issuer,
    joined by `/` (empty parts at the end dropped)."""
    parts = [client_id, subject if subject and subject != client_id else "", str(issuer) if issuer else ""]
    return "/".join(parts).rstrip("/")


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


def policy_fingerprint(policy: ToolPolicy, arguments: Mapping[str, Any], *, canonical: bytes | None = None) -> str:
    """The fingerprint of a call under `policy`: of the arguments `policy.fingerprinted` keeps
    (all of them by default, when `canonical` may be given as for `fingerprint`)."""
    if policy.fingerprints_all_arguments:
        return fingerprint(arguments, canonical=canonical)
    return fingerprint(policy.fingerprinted(arguments))


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
    `fingerprint_hex` is `policy_fingerprint(policy, arguments)` when the caller has that (a key
    derived from all arguments is the fingerprint: `fingerprint_fields` shape both alike).

    Raises `MissingKeyError` when the policy requires a caller key and none was sent, and
    `InvalidKeyError` for a key that is not 1–255 printable ASCII characters.
    """
    if meta is not None:
        if KEY_META in meta:
            return validate_key(tool, meta[KEY_META])
        for name in policy.key_meta:  # other protocols' names, in the order the policy gives
            if name in meta:
                return validate_key(tool, meta[name])
    if policy.key_argument is not None:
        supplied = arguments.get(policy.key_argument)
        if supplied is not None:
            return validate_key(tool, supplied)
    if policy.key == "required":
        raise MissingKeyError(tool)
    if policy.interactive:
        return None  # never derived: see ToolPolicy.interactive
    if policy.key_fn is not None:
        return validate_key(tool, policy.key_fn(dict(arguments)))
    if policy.key_fields:
        return _key_from_fields(policy, tool, arguments)
    if policy.key == "derived":
        # == _hashed("sha256", arguments)
        return "sha256:" + (fingerprint_hex or policy_fingerprint(policy, arguments, canonical=canonical))
    return None


# -- scoped keys: what a tool passes downstream ------------------------------------------------------

#: Prefixes of the keys we derive ourselves (`sha256:<hex>` from the whole arguments,
#: `fields:<hex>` from several key fields): a `local` key with one of them stays as it is.
_DERIVED_PREFIXES = ("sha256:", "fields:")
#: The prefixes of a scoped key and of a step key too long to show whole (their SHA-256).
_HASHED_SCOPED = "scoped-sha256"
_HASHED_STEP = "step-sha256"
#: Principal spellings that would read as one of the prefixes above; escaped (first character
#: percent-encoded) so that no principal's scoped key can look like a derived or hashed key.
_RESERVED = frozenset({"sha256", "fields", _HASHED_SCOPED, _HASHED_STEP})
#: Printable ASCII except `%` (the escape) and `:` (the separator): kept as they are in a principal.
_PRINCIPAL_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) not in "%:")


def _principal_part(principal: str) -> str:
    """`principal` percent-encoded so it holds no `:` and only printable ASCII (injective)."""
    part = quote(principal, safe=_PRINCIPAL_SAFE, errors="surrogatepass")  # a lone surrogate too (JSON allows it)
    if part in _RESERVED:
        part = f"%{ord(part[0]):02X}{part[1:]}"
    return part


def scoped_key(principal: str, key: str) -> str:
    """The key scoped by principal: an injective function of `(principal, key)`, printable ASCII
    of at most 255 characters, for a downstream system several principals share.

    - `local` (stdio, in-memory) with a key holding no `:`, or one of our derived keys
      (`sha256:…`, `fields:…`): the key itself;
    - otherwise `P:key`, where `P` is the principal with `%`, `:`, non-printable and non-ASCII
      characters percent-encoded (so the first `:` always ends it: `a` + `b:K1` gives `a:b:K1`,
      `a:b` + `K1` gives `a%3Ab:K1`), and a principal spelled like a prefix above has its first
      character encoded;
    - over 255 characters: `scoped-sha256:` + the SHA-256 (hex) of that `P:key`.

    Two pairs never give one string: a result without `:`, or starting `sha256:` / `fields:`,
    is a `local` key; any other holds the (decodable) principal before its first `:`, or is a
    hash, whose prefix no principal's part can spell.
    """
    if principal == LOCAL_PRINCIPAL and (":" not in key or key.startswith(_DERIVED_PREFIXES)):
        return key
    scoped = f"{_principal_part(principal)}:{key}"
    if len(scoped) <= MAX_KEY_LENGTH:
        return scoped
    return f"{_HASHED_SCOPED}:" + hashlib.sha256(scoped.encode()).hexdigest()


def step_key(principal: str, key: str, name: str) -> str:
    """A downstream key for the durable step `name` of the call `(principal, key)`:
    `scoped_key/name`, with `%`, `/` and `:` in the name percent-encoded (other printable ASCII
    kept: `"buy label"` stays as it is), hashed as `step-sha256:…` when over 255 characters or
    not printable ASCII. No two principals' step keys meet: the encoded name adds no `:`, so a
    `local` step key has one only where its scoped key has, and the principal part before the
    first `:` still names the principal. (Within one principal, a step key can equal the scoped
    key of a call whose key ends in `/name`.)"""
    scoped = f"{scoped_key(principal, key)}/{quote(name, safe=_STEP_SAFE, errors='surrogatepass')}"
    if len(scoped) <= MAX_KEY_LENGTH and scoped.isascii() and scoped.isprintable():
        return scoped
    return f"{_HASHED_STEP}:" + hashlib.sha256(scoped.encode()).hexdigest()


#: Printable ASCII except `%` (the escape), `/` (the separator) and `:` (the principal's separator).
_STEP_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) not in "%/:")
