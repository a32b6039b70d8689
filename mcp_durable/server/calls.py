"""`DurableCalls`: the one path of a durable call through the engine, answered as MCP.

Every face that serves durable tools composes one: `DurableServer` for its Python tools, the
proxy (mcp_durable/proxy/) for an upstream's tools. The face validates the arguments and builds
the run (the tool's function, or a call forwarded upstream); this part does the rest, the same
for both: the key from the request's `_meta` or the policy, the principal, the engine's claim,
run and persistence, the telemetry, and the answer — a replay marked as one, each refusal
(`DurableError`) as the `isError` result of `results.refusal`, valid against the tool's output
schema.

It holds no tool: what a tool is, how it runs and what its output schema is, the face tells it
(`output_schema_of`, the `run` and `encode` of each call).

`CallAnswers`, the part of it that does not meet the engine or the SDK's request context (the
refusals and a run's result as the engine persists it), serves a face with a call path of its
own too: the FastMCP middleware (mcp_durable/fastmcp/), whose context is FastMCP's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from mcp import MCPError
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, InputRequiredResult

from .. import limits
from ..engine import Encoder, Engine, Runner, ToolOutcome
from ..errors import DurableError
from ..limits import CallLimits
from ..operations.telemetry import ObservedCall, Telemetry
from ..policy import ToolPolicy
from .results import OutputSchemas, answer, asks_for_input, dump_result, protocol_error_result, refusal
from .sdk_internals import request_meta

#: A face's principal of a tool call's context (None: no request being served).
PrincipalOf = Callable[[Context[Any, Any] | None], str]


class CallAnswers:
    """What a face's durable calls answer with: each refusal, and a run's result as the engine
    persists it (`outcome`, `protocol_error_outcome`).

    `limits` bound what a call journals; `output_schema_of(tool)` is the output schema the face
    declares for `tool` (a refusal is `structuredContent` only where it fits it).
    """

    def __init__(self, limits: CallLimits, output_schema_of: Callable[[str], dict[str, Any] | None]) -> None:
        self.limits = limits
        self.output_schema_of = output_schema_of
        #: Compiled output schemas (results.py).
        self.output_schemas = OutputSchemas()

    def refuse(self, tool: str, error: DurableError, key: str | None = None, text: str | None = None) -> CallToolResult:
        """`error` as the refusal result of a call of `tool` (see `results.refusal`), valid against
        the tool's output schema."""
        schema = self.output_schema_of(tool)
        return refusal(error, key, fits=lambda body: self.output_schemas.accepts(tool, schema, body), text=text)

    def protocol_error_outcome(self, name: str, policy: ToolPolicy, error: MCPError) -> ToolOutcome:
        """What a run that ended in a JSON-RPC error (`MCPError`: raised by the tool, or answered by
        the proxy's upstream) produced, by `policy.exceptions`, like any other exception:

        - `"persist"`: the error as an `isError` result (`results.protocol_error_result`),
          journaled and replayed to every repeat of the key;
        - `"release"`: `error` is raised again; the engine releases the claim (a retry runs again)
          and the caller gets the JSON-RPC error as it was raised.

        Under either policy an error that asks the client to act and call again (URL elicitation
        required) is an interim answer: released, never kept, and raised to the caller by `run`
        (a replay of it would stop the retry it asks for).
        """
        if asks_for_input(error):
            return ToolOutcome(error, b"", is_error=True, final=False)
        if policy.exceptions != "persist":
            raise error
        return self.outcome(name, policy, protocol_error_result(error), from_exception=True)

    def outcome(
        self,
        name: str,
        policy: ToolPolicy,
        result: CallToolResult | InputRequiredResult,
        payload: bytes | None = None,
        *,
        from_exception: bool = False,
    ) -> ToolOutcome:
        """A run's result as the engine persists it: the result and its journaled JSON (`payload`,
        when the conversion made it already: `dump_result(result)`). `from_exception`: the result
        stands for an exception (or a JSON-RPC error) kept under `exceptions="persist"`, which
        `tool_errors="release"` does not release.

        Interim (multi-round) answers are marked not final, so they are never journaled. A result
        over the result limit raises `LimitExceeded` (the engine releases the claim), or under
        `exceptions="persist"` becomes a persisted error result.
        """
        if isinstance(result, InputRequiredResult):
            return ToolOutcome(result, b"", is_error=False, final=False)
        final = result  # narrowed to CallToolResult, for the closure
        made = payload
        try:
            payload = limits.result_payload(
                name, lambda: made if made is not None else dump_result(final), self.limits.result_bytes
            )
        except limits.LimitExceeded as exc:
            if policy.exceptions != "persist":
                raise  # the engine releases the claim; answered in `run`
            result = self.refuse(name, exc, text=limits.outcome_text(exc, released=False))
            payload = dump_result(result)
            from_exception = True
        return ToolOutcome(result, payload, is_error=bool(result.is_error), from_exception=from_exception)


class DurableCalls(CallAnswers):
    """Durable calls of one face on `engine`: `run` is the path, `CallAnswers` what it answers with.

    `principal_of` names the caller of a context; `limits` and `output_schema_of` are
    `CallAnswers`'; `telemetry` (None: none) observes each call.
    """

    def __init__(
        self,
        engine: Engine,
        principal_of: PrincipalOf,
        limits: CallLimits,
        output_schema_of: Callable[[str], dict[str, Any] | None],
        telemetry: Telemetry | None,
    ) -> None:
        super().__init__(limits, output_schema_of)
        self.engine = engine
        self.principal_of = principal_of
        self.telemetry = telemetry

    async def plain(
        self, call: Awaitable[CallToolResult | InputRequiredResult], tool: str
    ) -> CallToolResult | InputRequiredResult:
        """The answer of `call`, a call of a face's plain (not durable) `tool`: a `DurableError`
        it raised (an admin tool refusing, the SDK wrapping it in a `ToolError`) becomes the same
        machine-readable refusal as a durable call's."""
        try:
            return await call
        except ToolError as exc:
            if isinstance(exc.__cause__, DurableError):
                return self.refuse(tool, exc.__cause__)
            raise

    async def run(
        self,
        name: str,
        policy: ToolPolicy,
        arguments: dict[str, Any],
        canonical: bytes,
        context: Context[Any, Any] | None,
        run: Runner,
        encode: Encoder | None = None,
        *,
        fingerprint: str | None = None,
    ) -> CallToolResult | InputRequiredResult:
        """One durable call through the engine, answered as MCP.

        `arguments` are the validated arguments (`canonical` their canonical JSON, size-checked;
        `fingerprint` the call's under `policy`, when known); `run` produces the tool's
        `ToolOutcome` (see `outcome`). Refusals (`DurableError`) become `isError` results; a replay
        carries the replay `_meta`; an interim answer (`input_required`, an interim JSON-RPC
        error) is passed on, never kept.
        """
        principal = self.principal_of(context)
        if self.telemetry is None or not self.telemetry.observing():
            return await self._run(
                name, policy, arguments, canonical, context, run, encode, principal, None, fingerprint
            )
        with self.telemetry.call(name, principal) as observed:
            return await self._run(
                name, policy, arguments, canonical, context, run, encode, principal, observed, fingerprint
            )

    async def _run(
        self,
        name: str,
        policy: ToolPolicy,
        arguments: dict[str, Any],
        canonical: bytes,
        context: Context[Any, Any] | None,
        run: Runner,
        encode: Encoder | None,
        principal: str,
        observed: ObservedCall | None,
        fingerprint: str | None,
    ) -> CallToolResult | InputRequiredResult:
        try:
            outcome = await self.engine.execute(
                tool=name,
                policy=policy,
                arguments=arguments,
                meta=caller_meta(context),
                run=run,
                encode=encode,
                principal=principal,
                canonical=canonical,
                fingerprint=fingerprint,
            )
        except limits.LimitExceeded as exc:  # the result could not be journaled; the claim was released
            if observed is not None:
                observed.refused(exc)
            return self.refuse(name, exc, text=limits.outcome_text(exc, released=True))
        except DurableError as exc:
            if observed is not None:
                observed.refused(exc)
            return self.refuse(name, exc, getattr(exc, "key", None))
        except ToolError as exc:
            # A DurableError inside the tool (e.g. the journal failing under a durable step),
            # wrapped by the SDK: answered with its code, not as an anonymous crash.
            if isinstance(exc.__cause__, DurableError):
                if observed is not None:
                    observed.refused(exc.__cause__)
                return self.refuse(name, exc.__cause__, getattr(exc.__cause__, "key", None))
            raise
        if isinstance(outcome.value, InputRequiredResult):
            return outcome.value
        if isinstance(outcome.value, MCPError):
            raise outcome.value  # an interim JSON-RPC error (`protocol_error_outcome`): released, not kept
        result = answer(outcome)
        if observed is not None:
            observed.answered(outcome, bool(result.is_error))
        return result


def caller_meta(context: Context[Any, Any] | None) -> Mapping[str, Any] | None:
    """The `_meta` of the request `context` serves, as a mapping (where a caller's key is); None
    without one."""
    if context is None:
        return None
    try:
        meta = request_meta(context)
    except (ValueError, AttributeError, LookupError):
        return None
    if meta is None:
        return None
    if isinstance(meta, Mapping):
        return meta
    dumped = getattr(meta, "model_dump", None)
    return dumped(by_alias=True) if dumped is not None else None
