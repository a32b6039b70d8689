"""One durable call of a FastMCP tool, as the engine needs it: arguments, results, errors, principal.

What the middleware (middleware.py) hands the engine is made here from FastMCP's public objects:

- `ArgumentCheck`: a tool's arguments validated before any claim, by the same pydantic rules
  FastMCP applies when it calls the function (its `without_injected_parameters` signature and
  `get_cached_typeadapter`), so a call with bad arguments claims nothing (a corrected retry with
  the same key runs) and the fingerprint is of the validated values, as `DurableServer`'s is.
  Tools that are not plain functions (transformed, proxied, OpenAPI) are fingerprinted on their
  arguments as sent, as the proxy does: they validate inside their own run.
- `call_result` / `tool_result`: FastMCP's `ToolResult` to the `CallToolResult` the journal keeps
  (`results.dump_result`) and back, so a first answer and every replay leave the middleware as
  the same object shape and reach the wire through FastMCP's own conversion.
- `Failure`: what an exception out of `call_next` is, by `DurableServer`'s rules (docs/policies.md,
  "Errors"): a tool's deliberate `ToolError` is a result; anything else is an exception.
- `token_principal`: the bearer token's identity, as `DurableServer.default_principal` spells it.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fastmcp.exceptions import FastMCPError, ToolError
from fastmcp.server.dependencies import get_access_token, without_injected_parameters
from fastmcp.tools import Tool, ToolResult
from fastmcp.tools.base import RawStructuredToolResult
from fastmcp.tools.function_tool import FunctionTool
from fastmcp.utilities.types import get_cached_typeadapter
from mcp import MCPError
from mcp_types import CallToolResult, TextContent
from pydantic import TypeAdapter
from pydantic_core import to_json, to_jsonable_python

from .. import keys
from ..keys import LOCAL_PRINCIPAL
from ..policy import ToolPolicy

#: The code FastMCP raises a `FunctionTool`'s own `timeout` with (`FunctionTool._run_body`).
FASTMCP_TOOL_TIMEOUT_CODE = -32000


class ArgumentCheck:
    """Validates one FastMCP tool's arguments as FastMCP will when it calls the function.

    `validated(arguments, strict)` returns the arguments as JSON values (defaults filled in, the
    values the function will get) or raises pydantic's `ValidationError`. For a tool that is not
    a `FunctionTool` it returns `arguments` unchanged: that tool validates inside its run.
    """

    def __init__(self, tool: Tool) -> None:
        self.tool = tool
        self._adapter: TypeAdapter[Any] | None = _capture_adapter(tool.fn) if isinstance(tool, FunctionTool) else None

    @property
    def validates(self) -> bool:
        """Whether arguments are validated here, before the claim (a plain function tool)."""
        return self._adapter is not None

    def validated(self, arguments: dict[str, Any], strict: bool) -> dict[str, Any]:
        adapter = self._adapter
        if adapter is None:
            return arguments
        if strict and _is_json(arguments):
            # As FastMCP: strict validation of JSON data runs in JSON mode (an enum's or a date's
            # JSON spelling validates; the string "10" for an int does not).
            bound = adapter.validate_json(to_json(arguments), strict=True)
        else:
            bound = adapter.validate_python(arguments, strict=True if strict else None)
        values: dict[str, Any] = to_jsonable_python(bound)
        return values


@dataclass(frozen=True, slots=True)
class DurableTool:
    """A durable tool as its calls need it: the FastMCP tool, its policy, its argument check."""

    tool: Tool
    policy: ToolPolicy
    arguments: ArgumentCheck

    @property
    def name(self) -> str:
        return self.tool.name


def _capture_adapter(fn: Callable[..., Any]) -> TypeAdapter[Any]:
    """A pydantic adapter over a stand-in with `fn`'s tool signature that returns its arguments.

    FastMCP validates a tool's arguments by calling the function through a `TypeAdapter` (which
    validates and calls in one step); the stand-in has the same parameters and annotations (the
    injected `Context` and dependencies removed, as FastMCP removes them), so validating through
    it applies the same rules without running the tool.
    """
    bare = without_injected_parameters(fn)
    signature = inspect.signature(bare)
    try:
        hints = typing.get_type_hints(bare, include_extras=True)
    except Exception:  # noqa: BLE001 - unresolvable forward references: the annotations as written
        hints = {}

    def capture(*args: Any, **kwargs: Any) -> dict[str, Any]:
        bound = signature.bind(*args, **kwargs)
        return dict(bound.arguments)

    annotations = {
        name: hints.get(name, parameter.annotation)
        for name, parameter in signature.parameters.items()
        if name in hints or parameter.annotation is not inspect.Parameter.empty
    }
    # The stand-in is read by pydantic as the function itself: its signature and annotations.
    capture.__signature__ = signature.replace(return_annotation=inspect.Signature.empty)  # type: ignore[attr-defined]
    capture.__annotations__ = annotations
    capture.__name__ = getattr(fn, "__name__", "tool")
    capture.__qualname__ = getattr(fn, "__qualname__", capture.__name__)
    capture.__module__ = getattr(fn, "__module__", __name__)
    return get_cached_typeadapter(capture)


def _is_json(value: Any) -> bool:
    """Whether `value` is made only of what a JSON parser produces (FastMCP's own test)."""
    if value is None or isinstance(value, str | int | float):
        return True
    if isinstance(value, list):
        return all(_is_json(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _is_json(item) for key, item in value.items())
    return False


def call_result(result: ToolResult) -> CallToolResult:
    """A tool's `ToolResult` as the `CallToolResult` that is journaled (`results.dump_result`).

    Taken before FastMCP's wire handler, which wraps a non-object structured value under
    `result` for 2025-11-25 clients: that happens alike to a first answer and to its replays.
    """
    made = result.to_mcp_result()
    if isinstance(made, CallToolResult):
        return made
    if isinstance(made, tuple):
        content, structured = made
        return CallToolResult(content=content, structured_content=structured)
    return CallToolResult(content=made)


def tool_result(result: CallToolResult) -> ToolResult:
    """A journaled (or refusal) `CallToolResult` as the `ToolResult` the middleware answers with."""
    if result.structured_content is not None and not isinstance(result.structured_content, dict):
        return RawStructuredToolResult(
            content=list(result.content),
            structured_content=result.structured_content,
            meta=result.meta,
            is_error=result.is_error,
        )
    return ToolResult.from_mcp_result(result)


def error_result(text: str) -> CallToolResult:
    """An `isError` result with one text block: what FastMCP answers a `ToolError` with."""
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


#: What an exception out of a durable tool's run is (`Failure.of`).
FailureKind = Literal["tool_error", "exception", "timed_out"]


@dataclass(frozen=True, slots=True)
class Failure:
    """An exception raised out of `call_next` for a durable tool, classified.

    - `tool_error`: the tool raised `ToolError` itself, a deliberate error result (`tool_errors`);
    - `timed_out`: FastMCP's own tool `timeout` stopped the function mid-run: its effect may
      have happened (the engine marks the call in doubt, as for `ToolPolicy.timeout`);
    - `exception`: anything else (`exceptions`).

    FastMCP turns every exception a tool raises into a `ToolError` before middleware sees it,
    raised `from` the original, with one of its own messages (`FastMCP.call_tool`): that is how
    an unexpected exception is told from a tool's own `ToolError`.
    """

    kind: FailureKind
    error: BaseException

    @classmethod
    def of(cls, error: BaseException, tool: Tool) -> Failure:
        if not isinstance(error, ToolError):
            return cls("exception", error)
        cause = error.__cause__
        if cause is None or isinstance(cause, FastMCPError) or not _wrapped_by_fastmcp(str(error), tool.name):
            return cls("tool_error", error)
        timeout = getattr(tool, "timeout", None)
        if timeout is not None and isinstance(cause, MCPError) and cause.error.code == FASTMCP_TOOL_TIMEOUT_CODE:
            return cls("timed_out", error)
        return cls("exception", error)

    @property
    def cause(self) -> BaseException | None:
        return self.error.__cause__


def _wrapped_by_fastmcp(message: str, tool: str) -> bool:
    """Whether `message` is one FastMCP gives the `ToolError` it wraps a tool's exception in."""
    return message.startswith(f"Error calling tool {tool!r}") or message in (
        "Rate limited by upstream API, please retry later",
        "Upstream request timed out, please retry",
    )


def token_principal() -> str:
    """The caller's principal: the authenticated bearer token's identity on HTTP, else `local`.

    Spelled as `mcp_durable.server.app.default_principal` spells it (client id, subject unless it
    is the client id, issuer), from FastMCP's `get_access_token`, which reads the token of the
    HTTP request being served.
    """
    token = get_access_token()
    if token is None:
        return LOCAL_PRINCIPAL
    claims: Mapping[str, Any] = token.claims or {}
    return keys.token_principal(token.client_id, token.subject, claims.get("iss"))
