"""Each refusal code on the wire: its HTTP status and its JSON-RPC error code, in one table.

A `DurableError` reaches a client in one of three shapes, each built from `WIRE` and nowhere else:

- a tool's `isError` result, the refusal object in `_meta["mcp-durable/error"]`
  (`server/results.py::refusal`): tools, admin tools, the proxy's forwarded tools;
- a JSON-RPC error whose code is `jsonrpc` and whose `data` is the refusal object
  (`server/results.py::refusal_error`): resource reads and the tasks' methods, where no result
  can carry it;
- an HTTP status and a page titled `title` (the console, `console/app.py`).

| code | HTTP | JSON-RPC | meaning |
|---|---|---|---|
| `missing_key`, `invalid_key` | 400 | -32602 | the request's key is absent or malformed |
| `non_finite_argument`, `arguments_too_deep` | 400 | -32602 | arguments JSON cannot hold |
| `too_large`, `not_serialisable` | 400 | -32602 | what the call would journal is refused |
| `key_reuse` | 422 | -32602 | the key was used with other arguments |
| `forbidden` | 403 | -32602 | the principal may not do this (not an admin) |
| `not_found` | 404 | -32602 | no such call (or one the principal may not see) |
| `in_progress`, `in_doubt`, `cancelled` | 409 | -32602 | the call's record refuses it as it stands |
| `operator_error` | 409 | -32602 | an operator action that does not apply to the record (*) |
| `determinism_error` | 500 | -32603 | a tool's durable steps differ from the journal's |
| `internal` | 500 | -32603 | a fault with no code of its own |
| `upstream_unavailable` | 502 | -32603 | the proxy's upstream cannot be reached |
| `journal_unavailable` | 503 | -32603 | the journal cannot be used right now |

(*) 409 Conflict: the action conflicts with the record's state (not in doubt, not running, not
finished). A malformed verdict (a result that is not JSON, a step out of range) shares the code,
and so the status.

The JSON-RPC code follows the HTTP status: a refusal of the request as it stands (4xx) is
-32602, invalid params; a failure of the server (5xx) is -32603, internal error. Both are the
standard JSON-RPC codes every client knows; the refusal's own code is in `data.error`. No other
code: the server-defined range (-32000 … -32099) belongs to the MCP specification and the SDK.

A `ConfigError` is not in the table and never a refusal: it is a programmer's error (a policy, a
journal URL, an option given at registration or construction). `wire_of` raises it again, so
where one would reach a client it goes to the server's log (with its traceback) instead.
Importing this module imports nothing of the SDK.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from .errors import ConfigError, DurableError

#: JSON-RPC 2.0's "invalid params" (`mcp_types.jsonrpc.INVALID_PARAMS`; a test holds them equal).
INVALID_PARAMS = -32602
#: JSON-RPC 2.0's "internal error" (`mcp_types.jsonrpc.INTERNAL_ERROR`).
INTERNAL_ERROR = -32603


@dataclass(frozen=True)
class Wire:
    """How one refusal code is answered: an HTTP status, a JSON-RPC error code, a page title."""

    status: int
    jsonrpc: int
    title: str


def _refused(status: int, title: str) -> Wire:
    return Wire(status, INVALID_PARAMS if status < 500 else INTERNAL_ERROR, title)


#: Every code a `DurableError` is answered with (a test holds it equal to the codes of errors.py).
WIRE = MappingProxyType(
    {
        "missing_key": _refused(400, "An idempotency key is required"),
        "invalid_key": _refused(400, "Invalid idempotency key"),
        "non_finite_argument": _refused(400, "An argument is not a finite number"),
        "arguments_too_deep": _refused(400, "The arguments nest too deep"),
        "too_large": _refused(400, "Too large to journal"),
        "not_serialisable": _refused(400, "Not JSON the journal can store"),
        "key_reuse": _refused(422, "Key used with other arguments"),
        "forbidden": _refused(403, "Forbidden"),
        "not_found": _refused(404, "Not found"),
        "in_progress": _refused(409, "Still in progress"),
        "in_doubt": _refused(409, "In doubt"),
        "cancelled": _refused(409, "Cancelled"),
        "operator_error": _refused(409, "The action does not apply"),
        "determinism_error": _refused(500, "The durable steps differ from the journal"),
        "internal": _refused(500, "Internal error"),
        "upstream_unavailable": _refused(502, "The upstream is unavailable"),
        "journal_unavailable": _refused(503, "The journal is unavailable"),
    }
)


def wire_of(error: DurableError) -> Wire:
    """How `error` is answered on the wire (`WIRE` by its code; a code missing from the table is
    answered as `internal`).

    Raises `error` itself when it is a `ConfigError`: a programmer's error is not answered as a
    refusal, it propagates to the server's log (the SDK then answers an anonymous error)."""
    if isinstance(error, ConfigError):
        raise error
    return WIRE.get(error.code) or WIRE["internal"]
