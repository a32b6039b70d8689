"""Durable MCP tasks for FastMCP tools, in both protocol generations (docs/fastmcp.md, "Tasks").

`make_durable` registers `DurableTasks` on the server: FastMCP's own seam for tasks, a
`ServerExtension` with the tasks extension's identifier (`io.modelcontextprotocol/tasks`, the one
FastMCP requires for a tool declared `task=True`, and the one `fastmcp-tasks` registers). A task
is a journaled call, as for `DurableServer` (docs/tasks.md): the protocol of both generations is
`server/tasks.py`'s `TaskProtocol`, and the tasks themselves the engine's (`engine/tasks.py`:
submit once per key, resume at start, cancel fenced across replicas). What this module adds is
only how a FastMCP server meets them:

- **`tools/call`**. The SDK-level middleware (`middleware`, added to FastMCP's low-level server)
  marks the request it serves (`_CALL`); the extension's `intercept_tool_call`, the last gate
  before the tool body and inside FastMCP's middleware chain (so auth, logging and rate limits
  see a task-creating call as any call), creates the task. 2026-07-28: `TaskProtocol.intercept`
  decides (the request declares the extension, the tool's task support, `task_after`) and answers
  `resultType: "task"` or the plain result. 2025-11-25 (`params.task`): the interceptor submits
  the task, and the middleware answers `{"task": …}` in place of the chain's result (a handler's
  result is validated as a `CallToolResult`; the middleware's is its own). The durable middleware
  passes a task-creating call on (`takes`): the task is the journaled call.
- **`tasks/*`**: the extension's `MethodBinding`s, served by `TaskProtocol` (2025-11-25
  `tasks/get|result|list|cancel`, 2026-07-28 `tasks/get|update|cancel`), each task looked up by
  `(principal, task id)`. `initialize`'s `capabilities.tasks`, 2025-11-25 `tools/list`'s
  `execution.taskSupport` and 2026-07-28 task subscriptions: `TaskProtocol.middleware`.
- **The run**: in the background, outside the request (no request context, as for
  `DurableServer`), the FastMCP tool itself (`Tool.run` under a bare FastMCP `Context`), its
  result and errors classified by the durable middleware's rules (`DurableMiddleware.failed`).
  The same run resumes an in-doubt task at start and on a read (`resume`, the engine's
  `task_resumer`).
- **A task that asks** (an `interactive` tool): its run has a request of its own whose session
  is `DurableServer`'s `client_requests.TaskSession` (`task_request`), so `ctx.elicit` (and
  `ctx.session`'s sampling, roots) is a question of the task, journaled (`TaskRuns.ask`) and
  served by `TaskProtocol` (2026-07-28 `inputRequests` / `tasks/update`, 2025-11-25
  `tasks/result`); a run answering FastMCP's `InputRequiredResult` (the guard pattern) has its
  questions asked the same way and runs again with their answers as `ctx.input_responses`;
  `asks_first` runs a tool's guard in the creating 2026-07-28 request first (`TaskInputFirst`:
  no task until it is satisfied).

Which tools are tasks (`task_policy`): a tool declared `task=True` (FastMCP's `TaskConfig`: its
mode is the task support), and a tool whose policy sets `task_support`. A `task=True` tool no
policy makes durable gets `ToolPolicy(idempotent=False)`: its killed task is in doubt and ends
`failed` (`in_doubt`) until an operator resolves it, never run twice by itself.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import anyio
import orjson
from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.server.context import Context
from fastmcp.server.dependencies import bind_request_context
from fastmcp.server.extensions import MethodBinding, ServerExtension, ToolCallContinuation, ToolCallOutcome
from fastmcp.tools import Tool, ToolResult
from fastmcp.tools.base import InputRequiredToolResult
from mcp import MCPError
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    InputRequiredResult,
    PaginatedRequestParams,
    TextContent,
)
from mcp_types.jsonrpc import INVALID_PARAMS, METHOD_NOT_FOUND
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ValidationError

from .. import keys, limits
from ..engine import Engine, Runner, ToolOutcome
from ..journal import CallRecord
from ..limits import CallLimits
from ..policy import TaskSupport, ToolPolicy
from ..server.calls import CallAnswers
from ..server.client_requests import question_of, task_request
from ..server.results import refusals_as_jsonrpc
from ..server.tasks import TASKS_EXTENSION, TaskIdParams, TaskInputFirst, TaskProtocol, TaskUpdateParams
from ..steps import DurableCall
from .calls import FASTMCP_TOOL_TIMEOUT_CODE, DurableTool, Failure, call_result, tool_result
from .internals import low_level_server

if TYPE_CHECKING:
    from mcp.server.mcpserver import Context as SDKContext


__all__ = ["DurableTasks", "Guard", "TaskHost", "asks_first", "install_tasks", "task_policy"]

logger = logging.getLogger(__name__)

#: The 2025-11-25 generation, where a client asks for a task with `params.task`.
LEGACY_VERSIONS = frozenset({"2025-11-25"})
#: Rounds of questions (`InputRequiredResult`s) one run of a task's tool may answer at most
#: before the task fails: a guard that never accepts its answers would otherwise ask forever.
MAX_ROUNDS = 32

#: A tool's guard (`asks_first`): its questions for the request (`ctx.input_responses`,
#: `ctx.request_state`), or None once the answers it has satisfy it.
Guard = Callable[[Context], Awaitable[InputRequiredResult | None]]
_GUARD_ATTRIBUTE = "__mcp_durable_asks_first__"


_F = TypeVar("_F", bound=Callable[..., Any])


def asks_first(guard: Guard) -> Callable[[_F], _F]:
    """Declare the guard of an interactive FastMCP tool whose questions come before its task
    (2026-07-28 multi-round `tools/call`, SEP-2663's MRTR composition): a task-creating call of
    it runs `guard` in the request first and, while it has questions, is answered with them
    (`input_required`, no task); the round that satisfies it creates the task, whose first run
    reads that round's answers as `ctx.input_responses`. Put it under `@app.tool`:

        @app.tool(task=TaskConfig(mode="required"))
        @asks_first(needs_name)
        async def greet(ctx: Context) -> str | InputRequiredResult:
            asked = await needs_name(ctx)  # in the task: a run resumed without the answers asks again
            if asked is not None:
                return asked
            ...

    The guard reads the context only (it must not act: it runs in each round's request, outside
    the journal). A task run that answers `input_required` itself asks those questions of its
    requestor through the task, as `ctx.elicit` does (docs/fastmcp.md, "Tasks that ask")."""

    def mark(fn: _F) -> _F:
        setattr(fn, _GUARD_ATTRIBUTE, guard)
        return fn

    return mark


def _guard_of(tool: Tool) -> Guard | None:
    fn = getattr(tool, "fn", None)
    guard = getattr(fn, _GUARD_ATTRIBUTE, None) or getattr(getattr(fn, "__wrapped__", None), _GUARD_ATTRIBUTE, None)
    return cast(Guard | None, guard)


@dataclass(slots=True)
class _ToolCall:
    """The `tools/call` request being served, as the SDK-level middleware saw it."""

    request: ServerRequestContext[Any, Any]
    name: object
    #: A 2025-11-25 `params.task` call: the interceptor creates the task, the middleware answers it.
    legacy_task: bool
    #: The task the interceptor created (or found) for a 2025-11-25 `params.task` call.
    record: CallRecord | None = None
    #: Whether the interceptor has seen the call (a tool calling another tool is not it).
    intercepted: bool = False


#: The `tools/call` request being served (None: none, or a task's run in the background).
_CALL: ContextVar[_ToolCall | None] = ContextVar("mcp_durable_fastmcp_tool_call", default=None)


def _modern(request: ServerRequestContext[Any, Any]) -> bool:
    return request.protocol_version in MODERN_PROTOCOL_VERSIONS


def _declares_tasks(request: ServerRequestContext[Any, Any]) -> bool:
    """Whether this 2026-07-28 request declares the tasks extension (as `TaskProtocol.intercept` reads it)."""
    capabilities = request.session.client_capabilities
    return capabilities is not None and TASKS_EXTENSION in (capabilities.extensions or {})


def task_policy(tool: Tool, policy: ToolPolicy | None, passed_through: bool) -> ToolPolicy | None:
    """`policy` (None: not durable) with the task support FastMCP's own `task=True` declares.

    A tool declared `task=True` (its `TaskConfig` mode `optional` or `required`) runs as a durable
    task: its policy's `task_support` when that asks for tasks, else the tool's mode; a tool no
    policy makes durable gets `ToolPolicy(idempotent=False)` with it. A tool the policies pass
    through (`passed_through`) stays untouched."""
    mode: TaskSupport = tool.task_config.mode
    if mode == "forbidden" or passed_through:
        return policy
    if policy is None:
        return ToolPolicy(idempotent=False, task_support=mode)
    if policy.task_support == "forbidden":
        return dataclasses.replace(policy, task_support=mode)
    return policy


class TaskHost(Protocol):
    """What the tasks take of the durable middleware (`middleware.DurableMiddleware`): its server,
    engine, tools and policies, limits, answers, principals, and its rules for a run's outcome."""

    app: FastMCP[Any]
    engine: Engine
    limits: CallLimits
    answers: CallAnswers
    durable: dict[str, DurableTool]
    durable_policies: dict[str, ToolPolicy]
    principal_of: Callable[[Context | None], str]

    def durable_tool(self, tool: Tool) -> DurableTool | None: ...

    def failed(self, durable: DurableTool, failure: Failure) -> ToolOutcome: ...

    def encoder(self, name: str) -> Callable[[Any], ToolOutcome] | None: ...


class _Host:
    """What `TaskProtocol` sees of the FastMCP server (`server.ports.DurableHost`): the durable
    middleware's engine and policies, and the caller's principal by its `principal` rule."""

    def __init__(self, durable: TaskHost) -> None:
        self._durable = durable

    @property
    def engine(self) -> Engine:
        return self._durable.engine

    @property
    def policies(self) -> Mapping[str, ToolPolicy]:
        return self._durable.durable_policies

    def principal_of(self, context: SDKContext[Any, Any] | None, /) -> str:
        return self._durable.principal_of(Context(fastmcp=self._durable.app))

    def request_principal(self, request: ServerRequestContext[Any, Any] | None) -> str:
        return self._durable.principal_of(Context(fastmcp=self._durable.app))

    def is_admin(self, principal: str) -> bool:
        return False  # a FastMCP server has no admin principals (docs/fastmcp.md)


class DurableTasks(ServerExtension):
    """The tasks extension of a FastMCP server made durable (see the module docstring).

    Built and registered by `install_tasks` (from `make_durable`); `protocol` is the
    `TaskProtocol` serving both generations from the durable middleware's engine.
    """

    identifier = TASKS_EXTENSION

    def __init__(self, durable: TaskHost) -> None:
        self.durable = durable
        self.protocol = TaskProtocol(_Host(durable), self._submit)

    # -- which calls are tasks ---------------------------------------------------------------------

    def takes(self, name: str) -> bool:
        """Whether the `tools/call` of `name` being served is the interceptor's to answer (a task
        to create, or a task-required tool refused): the durable middleware passes it on."""
        call = _CALL.get()
        if call is None or call.intercepted or call.name != name:
            return False
        if call.legacy_task:
            return True
        if not _modern(call.request):
            return False
        policy = self.durable.durable_policies.get(name)
        if policy is None or policy.task_support == "forbidden":
            return False
        return policy.task_support == "required" or _declares_tasks(call.request)

    # -- the SDK-level middleware ------------------------------------------------------------------

    async def middleware(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """Server middleware on FastMCP's low-level server: marks each `tools/call` for the
        interceptor and answers a 2025-11-25 task-creating one with its task; every other request
        goes to `TaskProtocol.middleware` (capabilities, `execution.taskSupport`, task listens)."""
        if ctx.method != "tools/call" or ctx.request_id is None:
            return await self.protocol.middleware(ctx, call_next)
        params = ctx.params or {}
        name = params.get("name")
        asked = False
        if not _modern(ctx):
            support = self.protocol.task_support(name)
            asked = params.get("task") is not None and ctx.protocol_version in LEGACY_VERSIONS
            if asked and support == "forbidden":
                raise MCPError(code=METHOD_NOT_FOUND, message=f"Tool {name!r} does not support task augmentation")
            if asked and not isinstance(params.get("arguments") or {}, dict):
                raise MCPError(code=INVALID_PARAMS, message="arguments must be an object")
            if not asked and support == "required":
                raise MCPError(
                    code=METHOD_NOT_FOUND,
                    message=f"Tool {name!r} requires task augmentation (taskSupport: 'required')",
                )
        call = _ToolCall(ctx, name, legacy_task=asked)
        token = _CALL.set(call)
        try:
            result = await call_next(ctx)
        finally:
            _CALL.reset(token)
        if call.record is not None:
            return {"task": self.protocol.legacy_task(call.record)}
        return result

    # -- tools/call: the extension's interceptor ---------------------------------------------------

    async def intercept_tool_call(
        self, params: CallToolRequestParams, context: Context, call_next: ToolCallContinuation
    ) -> ToolCallOutcome:
        call = _CALL.get()
        if call is None or not self.takes(params.name):
            return await call_next()  # not a call from the wire, not a task, or a tool calling another one
        call.intercepted = True
        if call.legacy_task:
            call.record = await self._create(call.request, params.name, dict(params.arguments or {}))
            # Replaced by the middleware with `{"task": …}`; what the chain above sees meanwhile.
            return ToolResult(content=[TextContent(type="text", text=f"task {call.record.task_id} created")])

        async def rest(_: ServerRequestContext[Any, Any]) -> HandlerResult:
            return cast(HandlerResult, await call_next())

        answered = await self.protocol.intercept(params, call.request, rest)
        if isinstance(answered, CallToolResult):
            return tool_result(answered)  # finished within `task_after`: the plain result
        if isinstance(answered, InputRequiredResult):
            return InputRequiredToolResult(answered)  # its guard's questions first (`asks_first`): no task
        # `{"resultType": "task", …}` (FastMCP hands an extension's own shape to the runner as it
        # is), or the chain's result for a call that is not a task.
        return cast(ToolCallOutcome, answered)

    async def _create(
        self, request: ServerRequestContext[Any, Any], name: str, arguments: dict[str, Any]
    ) -> CallRecord:
        """Submit a 2025-11-25 task-creating call; refusals become JSON-RPC errors, as
        `TaskProtocol` answers them (there is no task to show them)."""
        try:
            with refusals_as_jsonrpc():
                return await self._submit(name, arguments, request)
        except ValidationError as exc:
            fields = sorted({".".join(str(p) for p in e["loc"]) for e in exc.errors()})
            raise MCPError(code=INVALID_PARAMS, message=f"Invalid arguments for tool {name!r}: {fields}") from None

    async def _submit(
        self, name: str, arguments: dict[str, Any], request: ServerRequestContext[Any, Any]
    ) -> CallRecord:
        """Create (or find, for a repeated key) the task of one call of FastMCP tool `name` (the
        `TaskSubmitter` of `TaskProtocol`): its arguments checked and validated before any claim,
        as the durable middleware checks a plain call's, then `Engine.submit`."""
        durable = self.durable
        tool = await durable.app.get_tool(name)
        made = None if tool is None else durable.durable_tool(tool)
        if made is None or made.policy.task_support == "forbidden":
            raise MCPError(code=METHOD_NOT_FOUND, message=f"Tool {name!r} does not support task augmentation")
        limits.check_argument_values(name, arguments, durable.limits.argument_depth)
        validated = made.arguments.validated(arguments, durable.app.strict_input_validation)
        limits.check_argument_values(name, validated, None)
        canonical = limits.checked_arguments(name, validated, durable.limits.argument_bytes)
        answers = await self._first_round(made, request) if made.policy.interactive else None
        meta = (request.params or {}).get("_meta")
        return await durable.engine.submit(
            tool=name,
            policy=made.policy,
            arguments=validated,
            meta=meta if isinstance(meta, Mapping) else None,
            run=self._runner(made, validated, request, answers),
            encode=durable.encoder(name),
            principal=durable.principal_of(Context(fastmcp=durable.app)),
            canonical=canonical,
            fingerprint=keys.policy_fingerprint(made.policy, validated, canonical=canonical),
        )

    async def _first_round(self, made: DurableTool, request: ServerRequestContext[Any, Any]) -> dict[str, Any] | None:
        """For a 2026-07-28 task-creating call of an interactive tool with a guard (`asks_first`):
        raise `TaskInputFirst` with the guard's questions while it has some for this request (no
        task yet); once satisfied, the round's answers (`inputResponses`, `requestState`) for the
        task's first run. None for any other call."""
        guard = _guard_of(made.tool)
        if guard is None or not _modern(request):
            return None
        asked = await guard(Context(fastmcp=self.durable.app))  # in the request (FastMCP bound it)
        if asked is not None:
            raise TaskInputFirst(asked)
        params = request.params or {}
        return {k: params[k] for k in ("inputResponses", "requestState") if params.get(k) is not None} or None

    # -- the run, and its resumption ---------------------------------------------------------------

    def _runner(
        self,
        made: DurableTool,
        arguments: dict[str, Any],
        request: ServerRequestContext[Any, Any] | None = None,
        answers: dict[str, Any] | None = None,
    ) -> Runner:
        """The engine's `run` of a task: the FastMCP tool with its validated `arguments`, in the
        background (a bare FastMCP `Context`: no request), its outcome as the middleware's.

        An interactive tool runs in a request of its own whose session asks the task's requestor
        (`client_requests.task_request`: `ctx.elicit`, `ctx.session`'s sampling and roots, each
        question and its answer journaled, `TaskRuns.ask`); when it answers `input_required`
        (FastMCP's guard pattern) its questions are asked the same way and it runs again with
        their answers as `ctx.input_responses` (`answers`: those of the request that created the
        task, for its first run)."""
        durable = self.durable
        if not made.policy.interactive:

            async def run(call: DurableCall | None) -> ToolOutcome:
                outcome = await self._run_once(made, arguments, None)
                assert not isinstance(outcome, InputRequiredToolResult)  # raised without a request
                return outcome

            return run

        async def run_asking(call: DurableCall | None) -> ToolOutcome:
            params: dict[str, Any] = {"name": made.name, "arguments": arguments, **(answers or {})}
            for _ in range(MAX_ROUNDS):
                bound = task_request(durable.engine.tasks.ask, request, params=params)
                outcome = await self._run_once(made, arguments, bound)
                if not isinstance(outcome, InputRequiredToolResult):
                    return outcome
                asked = outcome.input_required
                responses = await _ask_all(durable.engine.tasks.ask, call, asked)
                params = {"name": made.name, "arguments": arguments, "inputResponses": responses}
                if asked.request_state is not None:
                    params["requestState"] = asked.request_state
            raise RuntimeError(f"tool {made.name!r} asked for input {MAX_ROUNDS} times in one run")

        return run_asking

    async def _run_once(
        self, made: DurableTool, arguments: dict[str, Any], bound: ServerRequestContext[Any, Any] | None
    ) -> ToolOutcome | InputRequiredToolResult:
        """One run of the tool (in the request `bound`, when given): its outcome, or the
        `InputRequiredToolResult` it answered (an error for a tool that cannot ask: not interactive)."""
        durable = self.durable
        token = _CALL.set(None)  # a tool the task calls is not the request's call
        try:
            with bind_request_context(bound) if bound is not None else nullcontext():
                async with Context(fastmcp=durable.app):
                    result = await made.tool.run(dict(arguments))
        except Exception as exc:  # noqa: BLE001 - classified: a result, in doubt, or raised again
            return durable.failed(made, _failure(exc, made.tool))
        finally:
            _CALL.reset(token)
        if isinstance(result, InputRequiredToolResult):
            if bound is None:
                raise RuntimeError(
                    f"tool {made.name!r} asked its client for input: declare it interactive "
                    "(ToolPolicy(interactive=True)) to ask through its task"
                )
            return result
        return durable.answers.outcome(made.name, made.policy, call_result(result))

    async def resume(self, record: CallRecord) -> None:
        """The engine's `task_resumer`: drive an in-doubt task on by its tool's policy (`retry`
        runs the tool again, durable steps replaying; `reconcile` asks the hook; `refuse` leaves
        it). A tool that is gone leaves the task in doubt for an operator."""
        made = self.durable.durable.get(record.identity.tool)
        if made is None or record.arguments is None:
            return
        arguments = orjson.loads(record.arguments)
        run = self._runner(made, arguments)  # an interactive tool's first answers are asked again
        await self.durable.engine.resume(record.identity, made.policy, run, self.durable.encoder(made.name))

    # -- tasks/* -----------------------------------------------------------------------------------

    def methods(self) -> Sequence[MethodBinding]:
        # A `DurableError` (the journal failing under a read, a cancel) is answered by every
        # method as `results.refusal_error`, as `DurableServer`'s tasks answer it.
        protocol = self.protocol

        async def get(ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
            with refusals_as_jsonrpc():
                return await protocol.get(ctx, params)

        async def result(ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
            with refusals_as_jsonrpc():
                return await protocol.result(ctx, params)

        async def list_tasks(ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams) -> dict[str, Any]:
            with refusals_as_jsonrpc():
                return await protocol.list(ctx, params)

        async def cancel(ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
            with refusals_as_jsonrpc():
                return await protocol.cancel(ctx, params)

        async def update(ctx: ServerRequestContext[Any, Any], params: TaskUpdateParams) -> dict[str, Any]:
            with refusals_as_jsonrpc():
                return await protocol.update(ctx, params)

        modern = frozenset(MODERN_PROTOCOL_VERSIONS)
        return (
            MethodBinding("tasks/get", TaskIdParams, get),
            MethodBinding("tasks/cancel", TaskIdParams, cancel),
            MethodBinding("tasks/result", TaskIdParams, result, protocol_versions=LEGACY_VERSIONS),
            MethodBinding("tasks/list", PaginatedRequestParams, list_tasks, protocol_versions=LEGACY_VERSIONS),
            MethodBinding("tasks/update", TaskUpdateParams, update, protocol_versions=modern),
        )


async def _ask_all(
    ask: Callable[[DurableCall, dict[str, Any]], Awaitable[dict[str, Any]]],
    call: DurableCall | None,
    asked: InputRequiredResult,
) -> dict[str, Any]:
    """Ask the requestor every question of `asked` at once (each journaled, `TaskRuns.ask`, in
    their order); their answers, by the tool's own keys."""
    if call is None:
        raise RuntimeError("a task's questions are asked within its durable call")
    requests = asked.input_requests or {}
    answers: dict[str, Any] = {}

    async def one(key: str, request: BaseModel) -> None:
        answers[key] = await ask(call, question_of(request))

    try:
        async with anyio.create_task_group() as group:
            for key, request in requests.items():
                group.start_soon(one, key, request)
                await anyio.sleep(0)  # each asked in its order: its journal key is the same on every run
    except BaseExceptionGroup as failed:
        if len(failed.exceptions) == 1:  # the engine classifies what the asking raised (fenced out…)
            raise failed.exceptions[0] from None
        raise
    return answers


def _failure(error: Exception, tool: Tool) -> Failure:
    """An exception out of `Tool.run`, as the durable middleware classifies one out of FastMCP's
    chain (`calls.Failure`): there FastMCP has wrapped it in a `ToolError` of its own, so it is
    wrapped the same way here (a tool's own `ToolError` stays a deliberate error result)."""
    if isinstance(error, ToolError):
        return Failure("tool_error", error)
    wrapped = ToolError(f"Error calling tool {tool.name!r}: {error}")
    wrapped.__cause__ = error
    timeout = getattr(tool, "timeout", None)
    if timeout is not None and isinstance(error, MCPError) and error.error.code == FASTMCP_TOOL_TIMEOUT_CODE:
        return Failure("timed_out", wrapped)
    return Failure("exception", wrapped)


def install_tasks(durable: TaskHost, serve: bool | None) -> DurableTasks | None:
    """Serve durable tasks on `durable.app` (`make_durable(tasks=…)`): the extension registered,
    its middleware added to FastMCP's low-level server, the engine's task resumer set.

    `serve` None (the default): unless a tasks extension is registered already (`fastmcp-tasks`),
    which then keeps serving tasks, unjournaled, and a warning says so; True: a tasks extension
    registered already is an error (FastMCP's `ValueError`); False: no tasks. Returns the
    extension (None: not served).
    """
    if serve is False:
        return None
    app = durable.app
    tasks = DurableTasks(durable)
    try:
        app.add_extension(tasks)
    except ValueError:
        if serve is True:
            raise
        logger.warning(
            "%s: a tasks extension is registered already (fastmcp-tasks?): its task-augmented calls are "
            "not journaled; remove it to serve durable tasks, or pass make_durable(tasks=False) "
            "(docs/fastmcp.md)",
            app.name,
        )
        return None
    low_level_server(app).middleware.append(tasks.middleware)
    durable.engine.task_resumer = tasks.resume
    durable.engine.task_policy = durable.durable_policies.get
    return tasks
