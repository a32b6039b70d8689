"""Turning engine answers into MCP results: replay marking, and refusals on the wire.

The one function that turns a `DurableError` into a result is `refusal()`; the one that turns it
into a JSON-RPC error (a resource read, a task's method: no result to carry it) is
`refusal_error()`, with the JSON-RPC code of `wire_errors.WIRE`. Neither answers a `ConfigError`:
a programmer's error is raised again, to the server's log (`wire_errors.wire_of`). The refusal object
`{"error": code, "message": …, …details}` is always in the result's `_meta["mcp-durable/error"]`
(one place every client can read it), and is also the result's `structuredContent` only where
that is valid against the tool's declared output schema: a client that validates structured
content (the TypeScript SDK, the Inspector) would otherwise reject the whole answer, e.g. for a
tool returning `str`, whose schema requires `{"result": …}`. The text content is the human
message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson
from mcp import MCPError
from mcp_types import URL_ELICITATION_REQUIRED, CallToolResult, TextContent

from ..engine import CallOutcome
from ..errors import DurableError
from ..views import iso
from ..wire_errors import wire_of

META_KEY = "mcp-durable/key"
META_REPLAYED = "mcp-durable/replayed"
META_FIRST_COMPLETED = "mcp-durable/first-completed-at"
META_RECONCILED = "mcp-durable/reconciled"
META_ATTEMPT = "mcp-durable/attempt"
#: This call ran the tool, but another outcome was recorded for the key first (its lease was
#: taken over, or an operator resolved it): the result is the recorded one (engine.CallOutcome).
META_SUPERSEDED = "mcp-durable/superseded"
#: Where every refusal carries its `{error, message, …}` (valid for every client, whatever the tool's output schema).
META_ERROR = "mcp-durable/error"
#: Where a JSON-RPC error a tool (or an upstream) answered with, kept as its result under
#: `exceptions="persist"`, carries its `{code, message, data?}` (`protocol_error_result`).
META_JSONRPC_ERROR = "mcp-durable/jsonrpc-error"


def dump_result(result: CallToolResult) -> bytes:
    """The JSON bytes a result is journaled as: its wire form, so replay is byte-identical."""
    return orjson.dumps(result.model_dump(by_alias=True, mode="json", exclude_none=True))


def load_result(payload: bytes) -> CallToolResult:
    return CallToolResult.model_validate(orjson.loads(payload), by_name=False)


def _with_meta(result: CallToolResult, extra: dict[str, Any]) -> CallToolResult:
    merged = {**(result.meta or {}), **extra}
    return result.model_copy(update={"meta": merged})


def answer(outcome: CallOutcome) -> CallToolResult:
    """The result to send for an engine outcome: the tool's own on a run, the stored one on replay.

    A replay's result may be the very object an earlier replay of the same record got: callers
    must not mutate it.
    """
    if outcome.payload is None:
        assert isinstance(outcome.value, CallToolResult)
        return outcome.value  # unkeyed call: not journaled, not marked
    if outcome.replayed:
        rendered: CallToolResult | None = outcome.rendered
        if rendered is not None:
            return rendered  # made once, kept in the engine's replay cache
        return replay_answer(outcome)
    if isinstance(outcome.value, CallToolResult):
        return _answer(outcome.value, outcome)
    return _answer(load_result(outcome.payload), outcome)


def replay_answer(outcome: CallOutcome) -> CallToolResult:
    """The answer to a repeat: the stored result with the replay `_meta`. The engine makes it once
    per record it keeps for repeats (`Engine.render_replay`) and hands the same object to each
    of them: nothing mutates a result once returned (the SDK dumps it into fresh dicts)."""
    assert outcome.payload is not None
    return _answer(load_result(outcome.payload), outcome)


def _answer(result: CallToolResult, outcome: CallOutcome) -> CallToolResult:
    meta: dict[str, Any] = {META_KEY: outcome.key}
    if outcome.replayed:
        meta[META_REPLAYED] = True
    if outcome.first_completed_at is not None:
        meta[META_FIRST_COMPLETED] = iso(outcome.first_completed_at)
    if outcome.reconciled:
        meta[META_RECONCILED] = True
    if outcome.superseded:
        meta[META_SUPERSEDED] = True
    return _with_meta(result, meta)


class OutputSchemas:
    """Whether a value is valid against a tool's output schema, with one compiled validator per tool.

    Compiling a schema costs ~60 times a validation, so validators are kept per tool name and
    rebuilt when the tool's schema object changes (a tool registered again). A schema that is
    not valid JSON Schema validates nothing: the refusal then goes in `_meta` only.
    """

    def __init__(self) -> None:
        # Values: (the schema object, its compiled jsonschema validator or None if invalid).
        self._validators: dict[str, tuple[dict[str, Any], Any]] = {}

    def accepts(self, tool: str, schema: dict[str, Any] | None, value: Any) -> bool:
        """True when `value` is valid structured content for a tool declaring `schema` (None: any)."""
        if schema is None:
            return True
        cached = self._validators.get(tool)
        if cached is None or cached[0] is not schema:
            cached = (schema, _compile(schema))
            self._validators[tool] = cached
        validator = cached[1]
        return validator is not None and bool(validator.is_valid(value))


def _compile(schema: dict[str, Any]) -> Any:
    # As the MCP Python client compiles it: `$ref`s resolve within the document only. Imported
    # here, as the SDK does: jsonschema costs start-up time and only refusals need it.
    from jsonschema.validators import validator_for  # type: ignore[import-untyped]  # no stubs
    from referencing import Registry

    cls = validator_for(schema)
    try:
        cls.check_schema(schema)
    except Exception:  # noqa: BLE001 - any invalid schema: never claim a value fits it
        return None
    return cls(schema, registry=Registry())


def refusal_body(error: DurableError) -> dict[str, Any]:
    """The machine-readable refusal: `{"error": code, "message": …}` plus the error's details."""
    return {"error": error.code, "message": error.message, **error.details()}


def refusal(
    error: DurableError,
    key: str | None = None,
    *,
    fits: Callable[[dict[str, Any]], bool] | None = None,
    text: str | None = None,
) -> CallToolResult:
    """A refused call as an `isError` result (docs/policies.md, "Refusals and error codes").

    The refusal is in `_meta["mcp-durable/error"]` always, and is the `structuredContent` too
    when `fits(refusal)` (the tool's output schema accepts it; None: the tool declares none).
    `text` replaces the default human message `"<code>: <message>"`. `key` goes in
    `_meta["mcp-durable/key"]` when the call's key is known. Raises `error` itself when it is a
    `ConfigError` (`wire_errors.wire_of`): no refusal.
    """
    wire_of(error)  # a ConfigError is raised here, never answered
    body = refusal_body(error)
    meta: dict[str, Any] = {META_ERROR: body}
    if key is not None:
        meta[META_KEY] = key
    structured = body if fits is None or fits(body) else None
    return CallToolResult(
        content=[TextContent(type="text", text=text if text is not None else f"{error.code}: {error.message}")],
        structured_content=structured,
        is_error=True,
        _meta=meta,
    )


def refusal_error(error: DurableError, **context: Any) -> MCPError:
    """`error` as a JSON-RPC error, where no result can carry it (a resource read, a task's method).

    Its code is the refusal code's in `wire_errors.WIRE` (-32602 for a refusal of the request as
    it stands, -32603 for a failure of the server), its message `"<code>: <message>"` (what a
    refused tool call's text says), its `data` the refusal object `refusal_body(error)` after the
    `context` fields (e.g. the resource's `uri`). Raises `error` itself when it is a `ConfigError`.
    """
    wire = wire_of(error)
    return MCPError(wire.jsonrpc, f"{error.code}: {error.message}", data={**context, **refusal_body(error)})


@contextmanager
def refusals_as_jsonrpc(**context: Any) -> Iterator[None]:
    """A `DurableError` raised in the block is raised again as `refusal_error(error, **context)`."""
    try:
        yield
    except DurableError as exc:
        raise refusal_error(exc, **context) from exc


def asks_for_input(error: MCPError) -> bool:
    """Whether a JSON-RPC error asks the client to act and call again (URL elicitation required,
    -32042): an interim answer like `InputRequiredResult`, never to be kept as the call's result."""
    return error.code == URL_ELICITATION_REQUIRED


def protocol_error_result(error: MCPError) -> CallToolResult:
    """A JSON-RPC error a tool raised (or an upstream answered) as the `isError` result that is
    journaled and replayed in its place (`exceptions="persist"`).

    The text is the error's message (a tool raising `MCPError` means it for the client, unlike an
    unexpected exception's); `_meta["mcp-durable/jsonrpc-error"]` keeps `{code, message, data}`,
    `data` only when it is JSON. No `structuredContent`: it would have to fit the tool's output
    schema, and this is no refusal of ours.
    """
    body: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.data is not None:
        try:
            orjson.dumps(error.data)
        except TypeError:  # not JSON: the code and message still say what happened
            pass
        else:
            body["data"] = error.data
    return CallToolResult(
        content=[TextContent(type="text", text=error.message)], is_error=True, _meta={META_JSONRPC_ERROR: body}
    )
