"""`make_durable(app, …)`: a FastMCP 4 server's tools made durable in process, by a middleware.

    app = FastMCP("payments")
    ...
    durable = make_durable(app, journal="sqlite:///payments.db", policies="policies.toml")

`DurableMiddleware.on_call_tool` is the seam: every `tools/call` of a durable tool goes through
the engine (`mcp_durable.engine.Engine`), which claims the call's key in the journal, runs the
rest of the middleware chain and the tool once (`call_next`), persists the result and replays
it to every repeat, with the same `_meta` and refusals as `DurableServer`
(`mcp_durable/server/results.py`). Which tools are durable: the policies given, by name, else the
tool's own annotations (`idempotentHint: true`, not `readOnlyHint`), as for the proxy
(`policy_file.Policies.for_tool`). The engine starts and stops with the server's lifespan, through
a component-less `Provider` whose lifespan FastMCP enters at start (`EngineLifespan`).

The parts every face composes are shared with `DurableServer` and the proxy, not rewritten: the
limits (`limits.CallLimits`), the refusals and a run's result as the engine persists it
(`server.calls.CallAnswers`), the engine's lifetime with background recovery and retention
(`server.lifetime.EngineLifetime`) and their defaults (`server.assembly`), and telemetry
(`operations.telemetry`: the global OpenTelemetry providers by default, each call observed on
FastMCP's `tools/call` span as `server.calls.DurableCalls` observes the SDK's). The call path itself
is this middleware's: the key and the principal come from FastMCP's context, and what FastMCP
raises and answers are its own types.

MCP tasks are the tasks extension's (tasks.py): a task-creating call passes this middleware on
(`DurableTasks.takes`), and the extension's interceptor journals it as a task. Not covered yet
(docs/fastmcp.md): multi-round `input_required` answers (interim: answered, never journaled).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypedDict, Unpack

from fastmcp import FastMCP
from fastmcp.exceptions import ValidationError as FastMCPValidationError
from fastmcp.server.context import Context
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.server.providers import Provider
from fastmcp.tools import Tool, ToolResult
from fastmcp.tools.base import InputRequiredToolResult
from mcp import MCPError
from mcp_types import CallToolRequestParams, CallToolResult, ListToolsRequest, ToolAnnotations
from pydantic import ValidationError

from .. import keys, limits
from ..engine import Engine, Runner, ToolOutcome
from ..errors import DurableError, OutcomeUnknownError
from ..journal import Journal, create_journal, default_journal_url
from ..limits import CallLimits
from ..operations.recovery import BackgroundRecovery, ReconcilePass
from ..operations.retention import BackgroundRetention, RetentionSchedule
from ..operations.schedule import check_interval
from ..operations.telemetry import ObservedCall, Telemetry, face_telemetry
from ..policy import ToolPolicy, as_policy
from ..policy_file import PASS_THROUGH, Policies, Setting, load_policies
from ..server.assembly import DEFAULT_RECONCILE_INTERVAL, DEFAULT_RETENTION_SCHEDULE
from ..server.calls import CallAnswers
from ..server.lifetime import BackgroundJobs, EngineLifetime
from ..server.results import answer, dump_result, protocol_error_result, replay_answer
from ..steps import DurableCall
from . import order
from .calls import ArgumentCheck, DurableTool, Failure, call_result, error_result, token_principal, tool_result
from .tasks import DurableTasks, install_tasks, task_policy

logger = logging.getLogger(__name__)

#: What `make_durable(policies=…)` takes: a `Policies` (a TOML file read by `load_policies`), a
#: file path, or a mapping from tool name to a `ToolPolicy` (True: the defaults; False: not durable).
PoliciesArg = Policies | str | Path | Mapping[str, ToolPolicy | bool] | None


def as_policies(policies: PoliciesArg) -> Policies:
    """`policies` as a `Policies`: tools it does not name are decided by their annotations."""
    if policies is None:
        return Policies()
    if isinstance(policies, Policies):
        return policies
    if isinstance(policies, str | Path):
        return load_policies(policies)
    settings: dict[str, Setting] = {}
    for name, durable in policies.items():
        policy = as_policy(durable)
        settings[name] = PASS_THROUGH if policy is None else policy
    return Policies(settings)


class DurableOptions(TypedDict, total=False):
    """What `make_durable` (and `DurableMiddleware`) take besides the server, all optional.

    - `journal`: a URL (`file://…`, `sqlite:///…`, `postgresql://…`, `memory://`), a `Journal`, or
      None for the embedded default `file://.mcp-durable/journal` (the environment is not read).
    - `policies`: the durable tools and their `ToolPolicy` (`PoliciesArg`); a tool it does not
      name is durable when annotated `idempotentHint: true` and not `readOnlyHint: true`.
    - `principal(context)`: who a call is made by (records are scoped by it); by default the
      bearer token's identity on HTTP, else `local` (`calls.token_principal`).
    - `clock`, `instance_id`, `max_argument_bytes`, `max_result_bytes`, `max_argument_depth`,
      `reconcile_interval`, `retention_schedule`: as `DurableServer`'s, with its defaults.
    - `telemetry`: as `DurableServer`'s (docs/telemetry.md): None (the default) or True, the
      global OpenTelemetry providers; a `Telemetry`, its providers; False, none.
    - `tasks`: durable MCP tasks (fastmcp/tasks.py, docs/fastmcp.md): None (the default) serves
      them unless a tasks extension (`fastmcp-tasks`) is registered already; True serves them (an
      extension registered already is an error); False does not.
    """

    journal: str | Journal | None
    policies: PoliciesArg
    principal: Callable[[Context | None], str] | None
    clock: Callable[[], float] | None
    instance_id: str | None
    max_argument_bytes: int | None
    max_result_bytes: int | None
    max_argument_depth: int | None
    reconcile_interval: float | None
    retention_schedule: RetentionSchedule | None
    telemetry: Telemetry | bool | None
    tasks: bool | None


class DurableMiddleware(Middleware):
    """The FastMCP middleware that runs durable tools once per key (see the module docstring).

    Built and installed by `make_durable`, which takes the same keywords. `engine` is the
    `Engine` on `journal`; `provider` the component-less `Provider` whose lifespan starts and
    stops it with the server.
    """

    #: Its durable MCP tasks (tasks.py), set by `make_durable`; None: tasks are not served.
    tasks: DurableTasks | None = None

    def __init__(self, app: FastMCP[Any], **options: Unpack[DurableOptions]) -> None:
        self.app = app
        self.policies = as_policies(options.get("policies"))
        journal = options.get("journal")
        store = (
            create_journal(journal or default_journal_url(False))
            if journal is None or isinstance(journal, str)
            else journal
        )
        engine_kwargs: dict[str, Any] = {"instance_id": options.get("instance_id"), "process_id": f"server/{app.name}"}
        if options.get("clock") is not None:
            engine_kwargs["clock"] = options["clock"]
        self.engine = Engine(store, **engine_kwargs)
        # A repeat's answer is made once per record the engine keeps for repeats (its replay cache).
        self.engine.render_replay = replay_answer
        #: The calls' OpenTelemetry (None: off), `DurableServer`'s: attributes on FastMCP's
        #: `tools/call` span, child spans, metrics, the in-doubt gauge (operations/telemetry.py).
        self.telemetry: Telemetry | None = face_telemetry(options.get("telemetry"))
        if self.telemetry is not None:
            self.telemetry.attach(self.engine)
        self.principal_of: Callable[[Context | None], str] = options.get("principal") or _token_principal
        self.limits = CallLimits.checked(
            options.get("max_argument_bytes", limits.DEFAULT_MAX_ARGUMENT_BYTES),
            options.get("max_result_bytes", limits.DEFAULT_MAX_RESULT_BYTES),
            options.get("max_argument_depth", limits.DEFAULT_MAX_ARGUMENT_DEPTH),
        )
        #: The durable tools seen so far (at start and by calls), by name.
        self.durable: dict[str, DurableTool] = {}
        #: Their policies, by name: what background recovery reconciles.
        self.durable_policies: dict[str, ToolPolicy] = {}
        #: Refusals and run results, as every face answers them (server/calls.py).
        self.answers = CallAnswers(self.limits, self._output_schema_of)
        reconcile_interval = options.get("reconcile_interval", DEFAULT_RECONCILE_INTERVAL)
        self.recovery: BackgroundRecovery | None = None
        if check_interval("reconcile_interval", reconcile_interval) is not None:
            assert reconcile_interval is not None
            self.recovery = BackgroundRecovery(
                self.engine,
                self.durable_policies,
                self.encoder,
                reconcile_interval,
                after_pass=self._after_recovery_pass,
            )
        retention_schedule = options.get("retention_schedule", DEFAULT_RETENTION_SCHEDULE)
        self.retention: BackgroundRetention | None = None
        if retention_schedule is not None:
            check_interval("retention_schedule.interval", retention_schedule.interval)
            self.retention = BackgroundRetention(self.engine, retention_schedule)
        jobs = [job.run_forever for job in (self.recovery, self.retention) if job is not None]
        #: The engine, telemetry and the background jobs while the server runs.
        self.lifetime = EngineLifetime(self.engine, self.telemetry, BackgroundJobs(app.name, jobs))
        self.provider = EngineLifespan(self)

    @property
    def journal(self) -> Journal:
        return self.engine.journal

    # -- which tools are durable -------------------------------------------------------------------

    def policy_of(self, tool: Tool) -> ToolPolicy | None:
        """The tool's policy (None: not durable): the policies' setting, else its annotations;
        with tasks served, FastMCP's own `task=True` makes it a task (`tasks.task_policy`)."""
        annotations = (
            None if tool.annotations is None else tool.annotations.model_dump(by_alias=True, exclude_none=True)
        )
        policy = self.policies.for_tool(tool.name, annotations)
        if self.tasks is None:
            return policy
        return task_policy(tool, policy, self.policies.tools.get(tool.name) == PASS_THROUGH)

    def durable_tool(self, tool: Tool) -> DurableTool | None:
        """`tool` as a durable tool (None: it is not one), made once per tool object."""
        known = self.durable.get(tool.name)
        if known is not None and known.tool is tool:
            return known
        policy = self.policy_of(tool)
        if policy is None:
            self.durable.pop(tool.name, None)
            self.durable_policies.pop(tool.name, None)
            return None
        made = DurableTool(tool, policy, ArgumentCheck(tool))
        self.durable[tool.name] = made
        self.durable_policies[tool.name] = policy
        return made

    # -- the middleware ----------------------------------------------------------------------------

    async def on_list_tools(
        self, context: MiddlewareContext[ListToolsRequest], call_next: CallNext[ListToolsRequest, Sequence[Tool]]
    ) -> Sequence[Tool]:
        """The tools, each durable one advertising `idempotentHint: true` (the hint is now kept)."""
        tools = await call_next(context)
        return [self._advertised(tool) for tool in tools]

    def _advertised(self, tool: Tool) -> Tool:
        # The policy only: a listed tool may be a copy of the one a call runs (a caching
        # middleware lists base `Tool`s), which must not replace it in `durable`.
        policy = self.policy_of(tool)
        if policy is None or not policy.advertised_idempotent:
            return tool
        if tool.annotations is not None and tool.annotations.idempotent_hint is True:
            return tool
        base = tool.annotations or ToolAnnotations()
        return tool.model_copy(update={"annotations": base.model_copy(update={"idempotent_hint": True})})

    async def on_call_tool(
        self,
        context: MiddlewareContext[CallToolRequestParams],
        call_next: CallNext[CallToolRequestParams, ToolResult],
    ) -> ToolResult:
        tool = await self.app.get_tool(context.message.name)
        durable = None if tool is None else self.durable_tool(tool)
        if durable is None:
            return await call_next(context)  # not durable, or no such tool: FastMCP answers
        if self.tasks is not None and self.tasks.takes(durable.name):
            return await call_next(context)  # a task: journaled by the tasks' interceptor (tasks.py)
        name = durable.name
        arguments = dict(context.message.arguments or {})
        try:
            # What JSON cannot journal is refused before validation, and bad arguments before any
            # claim: a corrected retry with the same key runs.
            limits.check_argument_values(name, arguments, self.limits.argument_depth)
            validated = durable.arguments.validated(arguments, self.app.strict_input_validation)
            limits.check_argument_values(name, validated, None)
            canonical = limits.checked_arguments(name, validated, self.limits.argument_bytes)
        except ValidationError as exc:
            raise FastMCPValidationError(str(exc)) from exc  # FastMCP's own answer to bad arguments
        except DurableError as exc:
            return self._refuse(durable, exc)
        principal = self.principal_of(context.fastmcp_context)
        if self.telemetry is None or not self.telemetry.observing():
            return await self._execute(durable, context, call_next, validated, canonical, principal, None)
        # Observed as DurableServer's calls are (server/calls.py): on the span current here,
        # FastMCP's `tools/call` span, which it opens around the whole middleware chain.
        with self.telemetry.call(name, principal) as observed:
            return await self._execute(durable, context, call_next, validated, canonical, principal, observed)

    async def _execute(
        self,
        durable: DurableTool,
        context: MiddlewareContext[CallToolRequestParams],
        call_next: CallNext[CallToolRequestParams, ToolResult],
        validated: dict[str, Any],
        canonical: bytes,
        principal: str,
        observed: ObservedCall | None,
    ) -> ToolResult:
        """The call through the engine, answered; `observed` (None: no telemetry) told the outcome."""
        name = durable.name
        try:
            outcome = await self.engine.execute(
                tool=name,
                policy=durable.policy,
                arguments=validated,
                meta=_request_meta(context.fastmcp_context),
                run=self._runner(durable, context, call_next),
                encode=self.encoder(name),
                principal=principal,
                canonical=canonical,
                fingerprint=keys.policy_fingerprint(durable.policy, validated, canonical=canonical),
            )
        except limits.LimitExceeded as exc:  # the result could not be journaled; the claim was released
            if observed is not None:
                observed.refused(exc)
            return self._refuse(durable, exc, text=limits.outcome_text(exc, released=True))
        except DurableError as exc:
            if observed is not None:
                observed.refused(exc)
            return self._refuse(durable, exc, getattr(exc, "key", None))
        except Exception as exc:
            # A DurableError inside the tool (the journal failing under a durable step), which
            # FastMCP wrapped: answered with its code, as DurableServer answers it.
            if isinstance(exc.__cause__, DurableError):
                if observed is not None:
                    observed.refused(exc.__cause__)
                return self._refuse(durable, exc.__cause__, getattr(exc.__cause__, "key", None))
            raise
        if outcome.value is not None and not isinstance(outcome.value, CallToolResult):
            return outcome.value  # type: ignore[no-any-return]  # an interim answer, as the chain gave it
        result = answer(outcome)
        if observed is not None:
            observed.answered(outcome, bool(result.is_error))
        return tool_result(result)

    def _refuse(
        self, durable: DurableTool, error: DurableError, key: str | None = None, text: str | None = None
    ) -> ToolResult:
        """`error` as the refusal result (`CallAnswers.refuse`), valid against the tool's output schema."""
        return tool_result(self.answers.refuse(durable.name, error, key, text))

    def _output_schema_of(self, name: str) -> dict[str, Any] | None:
        """The output schema of the durable tool `name` as last seen (None: it has none, or is not known)."""
        durable = self.durable.get(name)
        return None if durable is None else durable.tool.output_schema

    def _runner(
        self,
        durable: DurableTool,
        context: MiddlewareContext[CallToolRequestParams],
        call_next: CallNext[CallToolRequestParams, ToolResult],
    ) -> Runner:
        """The engine's `run` for one call: the rest of the chain and the tool, its outcome encoded."""

        async def run(call: DurableCall | None) -> ToolOutcome:
            try:
                result = await call_next(context)
            except Exception as exc:  # noqa: BLE001 - classified: a result, in doubt, or raised again
                return self.failed(durable, Failure.of(exc, durable.tool))
            if isinstance(result, InputRequiredToolResult) or not isinstance(result, ToolResult):
                # A 2026-07-28 request for input, or an extension's own answer (a task created):
                # answered as it is, never journaled (the claim is released).
                return ToolOutcome(result, b"", is_error=False, final=False)
            return self.answers.outcome(durable.name, durable.policy, call_result(result))

        return run

    def failed(self, durable: DurableTool, failure: Failure) -> ToolOutcome:
        """What a run that raised produced, by the tool's policy (docs/policies.md, "Errors"): a
        result (`CallAnswers.outcome`, which bounds its size), in doubt, or raised again."""
        error = failure.error
        if failure.kind == "tool_error":
            return self.answers.outcome(durable.name, durable.policy, error_result(str(error)))
        if failure.kind == "timed_out":
            raise OutcomeUnknownError(
                f"FastMCP's timeout of {getattr(durable.tool, 'timeout', None)} s stopped the tool mid-run; "
                "its outcome is unknown"
            ) from error
        if durable.policy.exceptions != "persist":
            raise error  # the engine releases the claim: the next call with the key runs again
        # Kept as the exception's result, which `tool_errors="release"` does not release (as
        # DurableServer keeps it). A JSON-RPC error FastMCP wrapped keeps its code and data.
        cause = error.__cause__
        result = protocol_error_result(cause) if isinstance(cause, MCPError) else error_result(str(error))
        return self.answers.outcome(durable.name, durable.policy, result, from_exception=True)

    async def _after_recovery_pass(self, report: ReconcilePass) -> None:
        if self.telemetry is not None:
            await self.telemetry.refresh(self.journal)  # in-doubt calls other replicas marked, too

    def encoder(self, name: str) -> Callable[[Any], ToolOutcome] | None:
        """How a value a reconcile hook found for tool `name` becomes its result: the tool's own
        conversion (None: the tool has not been seen)."""
        durable = self.durable.get(name)
        if durable is None:
            return None
        tool = durable.tool

        def encode(value: Any) -> ToolOutcome:
            result = call_result(tool.convert_result(value))
            return ToolOutcome(result, dump_result(result), is_error=bool(result.is_error))

        return encode

    # -- start and stop (EngineLifespan) -----------------------------------------------------------

    @asynccontextmanager
    async def served(self) -> AsyncIterator[None]:
        """While the server runs: the durable tools learnt and middleware that would undo their
        guarantee warned about, then the engine's lifetime (`EngineLifetime`: the journal opened,
        background recovery and retention started, all stopped and the journal closed at the end).

        The tools are learnt first: the first recovery pass, at start, reconciles their policies.
        """
        for tool in await self.app.list_tools(run_middleware=False):
            self.durable_tool(tool)
        for problem in order.problems(self.app.middleware, self, self.durable):
            logger.warning("%s: %s", self.app.name, problem)
        async with self.lifetime.served():
            yield


class EngineLifespan(Provider):
    """A provider of no components whose lifespan is the durable middleware's engine: FastMCP
    enters every provider's lifespan when the server starts and leaves it when it stops."""

    def __init__(self, durable: DurableMiddleware) -> None:
        super().__init__()
        self.durable = durable

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        # FastMCP enters it once however many clients connect (its lifespan is counted), and
        # leaves it shielded from cancellation, so the stop is journaled even on Ctrl-C.
        async with self.durable.served():
            yield


def make_durable(app: FastMCP[Any], **options: Unpack[DurableOptions]) -> DurableMiddleware:
    """Make `app`'s durable tools run once per key: adds a `DurableMiddleware` (last: after the
    middleware already added, right before the tools) and its engine's lifespan; returns it.
    The keywords are `DurableOptions`; `tasks` adds durable MCP tasks (`tasks.install_tasks`)."""
    durable = DurableMiddleware(app, **options)
    app.add_middleware(durable)
    app.add_provider(durable.provider)
    durable.tasks = install_tasks(durable, options.get("tasks"))
    return durable


def _token_principal(context: Context | None) -> str:
    return token_principal()


def _request_meta(context: Context | None) -> Mapping[str, Any] | None:
    """The calling request's `_meta` (where the caller's key is): the request context's, not the
    middleware message's (FastMCP builds that message anew, without the caller's `_meta`)."""
    if context is None:
        return None
    request = context.request_context
    return None if request is None else request.meta
