"""Size limits on what a durable call writes to the journal: its arguments and its result. Pure.

Every durable call stores the canonical JSON of its validated arguments (for the fingerprint,
reconcile hooks and operators) and the JSON of its result (for replay). Unbounded, one buggy or
hostile call could fill the journal's disk or stall every other call behind one huge commit.

Defaults, and why:
- arguments: `DEFAULT_MAX_ARGUMENT_BYTES` = 1 MiB of canonical JSON (sorted keys, no
  whitespace). A tool call an agent makes is a few hundred bytes; 1 MiB leaves room for
  documents passed inline while keeping one record far below anything that hurts a commit.
  Checked on the validated arguments *before any claim*: an over-size call is a bad request,
  refused with code `too_large` (`not_serialisable` for arguments the journal cannot encode).
  Nothing is journaled, so a corrected retry with the same key still runs (the IETF
  Idempotency-Key draft: validation rejections are not saved).
- results: `DEFAULT_MAX_RESULT_BYTES` = 16 MiB of result JSON. Results are replayed in full, so
  they are allowed to be larger than arguments (a generated report, a file's text), but a result
  of tens of MiB belongs in a resource or a blob store, not in an idempotency record. Checked
  after the tool ran, before the result is persisted. A result over the limit, or one that
  cannot be serialised as JSON, cannot be replayed: the call's claim is released (never left
  PENDING), the caller gets a refusal (`too_large`, `not_serialisable`), and a retry runs the
  tool again, exactly like an unexpected exception. Under `ToolPolicy(exceptions="persist")` that error result is
  persisted and replayed instead, like any other persisted exception.

`None` disables a limit.

What a durable call's arguments may hold is checked too, before any claim, each with its own
refusal code (a `DurableError`, answered like every other refusal):
- depth: `DEFAULT_MAX_ARGUMENT_DEPTH` = 64 levels of nested objects and arrays (the arguments
  object is level 1): `arguments_too_deep`. Real tool arguments nest a few levels; without a
  limit, a few hundred levels fail deep inside serialisation with a message naming nothing. The
  SDK's own JSON parser refuses a request nested about 250 levels deep (the whole message, the
  JSON-RPC envelope included) with a `-32700` parse error before any server code sees it.
- finiteness: NaN, Infinity, -Infinity, and numbers beyond a 64-bit float (`1e400`, read as
  infinite) are refused with `non_finite_argument`: JSON cannot hold them, so the journal would
  store `null` and the fingerprint would equal a call that sent `null`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from .errors import (
    ArgumentsTooDeepError,
    ConfigError,
    LimitExceededError,
    NonFiniteArgumentError,
    NotSerialisableError,
    TooLargeError,
)
from .keys import canonical_json

DEFAULT_MAX_ARGUMENT_BYTES = 1 << 20
DEFAULT_MAX_RESULT_BYTES = 16 << 20
DEFAULT_MAX_ARGUMENT_DEPTH = 64

#: What a durable call would journal is too large (`TooLargeError`, code `too_large`) or not
#: JSON (`NotSerialisableError`, code `not_serialisable`). The MCP face answers both as refusals
#: (arguments: before any claim; results: after releasing the claim).
LimitExceeded = LimitExceededError


def check_limit(name: str, limit: int | None) -> int | None:
    """Validate a configured limit (`None`, or a positive number of bytes)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise ConfigError(f"{name} must be a positive number of bytes or None, not {limit!r}")
    return limit


@dataclasses.dataclass(frozen=True)
class CallLimits:
    """The three bounds on what one durable call journals, as a face is configured with them
    (`None` lifts a bound); `checked` refuses a bad configuration with `ConfigError`."""

    argument_bytes: int | None = DEFAULT_MAX_ARGUMENT_BYTES
    result_bytes: int | None = DEFAULT_MAX_RESULT_BYTES
    argument_depth: int | None = DEFAULT_MAX_ARGUMENT_DEPTH

    @classmethod
    def checked(
        cls,
        max_argument_bytes: int | None = DEFAULT_MAX_ARGUMENT_BYTES,
        max_result_bytes: int | None = DEFAULT_MAX_RESULT_BYTES,
        max_argument_depth: int | None = DEFAULT_MAX_ARGUMENT_DEPTH,
    ) -> CallLimits:
        """The limits named as the faces' keyword arguments name them, each validated (`check_limit`)."""
        return cls(
            check_limit("max_argument_bytes", max_argument_bytes),
            check_limit("max_result_bytes", max_result_bytes),
            check_limit("max_argument_depth", max_argument_depth),
        )


def checked_arguments(tool: str, arguments: Mapping[str, Any], limit: int | None) -> bytes:
    """The canonical JSON of `arguments`, or `LimitExceeded` if it is over `limit` or not JSON."""
    try:
        payload = canonical_json(arguments if type(arguments) is dict else dict(arguments))
    except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
        raise NotSerialisableError(
            f"the arguments of tool {tool!r} cannot be journaled: they are not JSON-serialisable ({exc})",
            what="arguments",
        ) from exc
    return check_arguments_size(tool, payload, limit)


def check_arguments_size(tool: str, payload: bytes, limit: int | None) -> bytes:
    """`payload` (the arguments' canonical JSON) if within `limit`; `LimitExceeded` otherwise."""
    if limit is not None and len(payload) > limit:
        raise TooLargeError(
            f"the arguments of tool {tool!r} are {len(payload)} bytes of canonical JSON; "
            f"the limit is {limit} bytes (max_argument_bytes). Pass large content by reference",
            what="arguments",
            size=len(payload),
            limit=limit,
        )
    return payload


def check_result(tool: str, payload: bytes, limit: int | None) -> bytes:
    """`payload` (a result's JSON) if within `limit`; `LimitExceeded` otherwise."""
    if limit is not None and len(payload) > limit:
        raise TooLargeError(
            f"the result of tool {tool!r} is {len(payload)} bytes of JSON; the limit is {limit} bytes "
            "(max_result_bytes)",
            what="result",
            size=len(payload),
            limit=limit,
        )
    return payload


def outcome_text(error: LimitExceeded, *, released: bool) -> str:
    """What the caller reads when a result could not be journaled (`released`: a retry runs again)."""
    if released:
        return (
            f"{error.code}: {error.message}. The call was not journaled: its claim was released and a retry "
            "runs the tool again"
        )
    return f"{error.code}: {error.message}. This error is journaled and replayed for the key"


def unserialisable_result(tool: str, exc: BaseException) -> LimitExceeded:
    """The error for a result that cannot be written as JSON (so it could never be replayed)."""
    error = NotSerialisableError(
        f"the result of tool {tool!r} cannot be journaled: it is not JSON-serialisable ({exc})",
        what="result",
    )
    error.__cause__ = exc
    return error


def result_payload(tool: str, dump: Callable[[], bytes], limit: int | None) -> bytes:
    """The result JSON `dump()` gives, checked against `limit`; `LimitExceeded` if too large or not JSON."""
    try:
        payload = dump()
    except (TypeError, ValueError) as exc:  # orjson's and pydantic's serialisation errors
        raise unserialisable_result(tool, exc) from exc
    return check_result(tool, payload, limit)


_Trail = tuple["_Trail", object] | None  # (parent trail, key): a path built only when reported


def _pointer(trail: _Trail) -> str:
    """The JSON Pointer (RFC 6901) of a trail: `/items/2/price`."""
    parts: list[str] = []
    while trail is not None:
        trail, key = trail
        parts.append(str(key).replace("~", "~0").replace("/", "~1"))
    return "/" + "/".join(reversed(parts))


def _children(value: Any) -> Any:
    """The (key, child) pairs of a container, or None for a leaf."""
    kind = type(value)
    if kind is dict:  # the raw JSON arguments, at once
        return value.items()
    if kind is list:
        return enumerate(value)
    if hasattr(kind, "__pydantic_fields__") and hasattr(value, "__dict__"):
        return vars(value).items()  # a pydantic model (the validated arguments): its fields' values
    if isinstance(value, Mapping):
        return value.items()
    if isinstance(value, list | tuple | set | frozenset):
        return enumerate(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
    return None


def _check_finite(tool: str, value: float, trail: _Trail, key: object) -> None:
    if not math.isfinite(value):
        raise NonFiniteArgumentError(tool, _pointer((trail, key)))


def check_argument_values(tool: str, arguments: Any, max_depth: int | None) -> bool:
    """Raise `ArgumentsTooDeepError` if `arguments` nests objects and arrays deeper than
    `max_depth` (None: no limit; `arguments` itself is level 1), or `NonFiniteArgumentError`
    naming the first NaN or infinite number found (by JSON Pointer). Walks without recursion,
    so any depth is safe to check; takes the raw JSON value or the validated arguments model.

    Returns whether `arguments` is plain JSON: only `dict`, `list`, `str`, `int`, `float`,
    `bool` and None, exactly (no subclass, no other type), which is what a request parsed from
    the wire always is. The face remembers validations of plain JSON only (`prevalidated`)."""
    plain = True
    stack: list[tuple[Any, int, _Trail]] = [(arguments, 1, None)]
    push = stack.append
    while stack:
        value, depth, trail = stack.pop()
        kind = type(value)
        if kind is dict:  # the raw JSON arguments, at once
            children: Any = value.items()
        elif kind is list:
            children = enumerate(value)
        else:
            plain = False
            children = _children(value)
            if children is None:
                continue
        if max_depth is not None and depth > max_depth:
            raise ArgumentsTooDeepError(tool, max_depth)
        for key, child in children:
            kind = type(child)
            if kind is str or kind is int or kind is bool or child is None:  # most leaves, at once
                continue
            if kind is float:
                _check_finite(tool, child, trail, key)
                continue
            if kind is not dict and kind is not list:
                plain = False  # a subclass of a JSON type, or no JSON type at all
                if isinstance(child, float):
                    _check_finite(tool, child, trail, key)
                    continue
            push((child, depth + 1, (trail, key)))
    return plain
