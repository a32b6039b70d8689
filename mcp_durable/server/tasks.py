"""MCP tasks on the journal: the protocol face of both generations (docs/tasks.md).

A task is a journaled call (`mcp_durable/tasks.py`); this module only speaks the two wire
dialects over the engine's `submit` / `task` / `cancel_task`:

- **2025-11-25** (tasks in core, client opts in with `params.task`). The SDK validates a
  legacy `tools/call` handler's result as a `CallToolResult`, so the `{"task": …}` answer is
  given by a server middleware (`TaskProtocol.middleware`), which owns its result. It also adds
  `capabilities.tasks` to `initialize` and `execution.taskSupport` to `tools/list`.
- **2026-07-28** (extension `io.modelcontextprotocol/tasks`, server decides). The `tools/call`
  interceptor of `TasksExtension` answers `resultType: "task"` (a shape the runner passes
  through) when this request declares the extension and the call is task-required or has
  not finished within the tool's `task_after`.
- `tasks/*` methods are `MethodBinding`s of the same extension, each answering in the
  dialect of the request's protocol version; `tasks/result` and `tasks/list` exist only in
  2025-11-25 (-32601 on 2026-07-28), `tasks/update` only in 2026-07-28.
- 2026-07-28 `subscriptions/listen` with `notifications.taskIds` is served by the middleware
  too (the SDK's listen handler knows only its own event kinds): it acknowledges the caller's
  own tasks among them and sends `notifications/tasks` (the `DetailedTask`) on every change,
  until all of them are terminal.

A task that asks its requestor (an `interactive` tool run as a task, `client_requests.TaskSession`)
has journaled questions without an answer (`TaskRuns.questions`) and is `input_required`:
2026-07-28 `tasks/get` lists them as `inputRequests` and `tasks/update` answers them; 2025-11-25
`tasks/result` sends each to the client as a request (with the related-task `_meta`) on its own
stream and journals the answer. A 2026-07-28 task-creating call of a tool with `Resolve`
parameters first answers `input_required` itself while its resolvers have questions
(`TaskInputFirst`, SEP-2663's MRTR composition); the round that answers them creates the task.

Security: every method looks a task up by `(principal, task id)`; another principal's task
gets exactly the unknown-id error (-32602, same message), and `tasks/list` lists only the
caller's own tasks. A task's questions are read and answered only through it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, cast

import anyio
from mcp import MCPError
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding, RequestHandler
from mcp.server.mcpserver import require_client_extension
from mcp.shared.exceptions import NoBackChannelError
from mcp.shared.message import ServerMessageMetadata
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY
from mcp_types import (
    CallToolRequestParams,
    CreateMessageResult,
    ElicitResult,
    InputRequiredResult,
    ListRootsResult,
    PaginatedRequestParams,
    RequestParams,
    TaskStatusNotification,
    TaskStatusNotificationParams,
)
from mcp_types.jsonrpc import HEADER_MISMATCH, INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict, ValidationError

from ..engine import CallOutcome
from ..journal import CallQuery, CallRecord
from ..policy import ToolPolicy
from ..tasks import has_task_result, task_view
from . import task_wire as wire
from .ports import DurableHost
from .results import answer, refusals_as_jsonrpc
from .task_wire import LEGACY_CAPABILITY, RELATED_TASK, TASK_NOT_FOUND, TASKS_EXTENSION

__all__ = [
    "RELATED_TASK",
    "TASK_NOT_FOUND",
    "TASKS_EXTENSION",
    "TaskInputFirst",
    "TaskProtocol",
    "TasksExtension",
    "skip_idle_interceptor",
]


logger = logging.getLogger(__name__)

LEGACY_VERSIONS = frozenset({"2025-11-25"})
#: `tasks/list` page size.
LIST_PAGE = 50
#: Sessions kept for status notifications at most (oldest dropped first).
MAX_WATCHED = 10_000


#: What answers each kind of question a task asks (a `tasks/update` answer is checked against it).
ANSWER_MODELS: dict[str, type[BaseModel]] = {
    "elicitation/create": ElicitResult,
    "sampling/createMessage": CreateMessageResult,
    "roots/list": ListRootsResult,
}


class TaskInputFirst(Exception):  # noqa: N818 - an answer, not a failure
    """Raised by a `TaskSubmitter` instead of creating a task: the call must first be answered
    with `result` (its `Resolve` parameters' questions, 2026-07-28 multi-round `tools/call`)."""

    def __init__(self, result: InputRequiredResult) -> None:
        super().__init__("the call needs input before its task is created")
        self.result = result


class _Question(BaseModel):
    """A task's question sent to a 2025-11-25 client (`ServerSession.send_request` dumps it)."""

    method: str
    params: dict[str, Any] | None = None


class _Answer(BaseModel):
    """The client's answer to a `_Question`, kept as it came (the SDK checks it by method)."""

    model_config = ConfigDict(extra="allow")


class TaskIdParams(RequestParams):
    """Params of `tasks/get`, `tasks/result`, `tasks/cancel`."""

    task_id: str


class TaskUpdateParams(RequestParams):
    """Params of `tasks/update` (2026-07-28)."""

    task_id: str
    input_responses: dict[str, Any] | None = None


def _modern(ctx: ServerRequestContext[Any, Any]) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def _task_policy(host: DurableHost, tool: str, ctx: ServerRequestContext[Any, Any]) -> ToolPolicy | None:
    """The policy of `tool` when a call of it in this request may become a task (a 2026-07-28
    request, a durable tool whose `task_support` is not "forbidden"); None for every other call,
    which `TasksExtension.intercept` passes straight on."""
    if not _modern(ctx):
        return None
    policy = host.policies.get(tool)
    return None if policy is None or policy.task_support == "forbidden" else policy


def _finished_within(record: CallRecord, policy: ToolPolicy) -> bool:
    """Whether the finished call of `record` ended within `task_after` of its creation: its first
    2026-07-28 caller was answered with the plain result, not a task (a resumed or operator-
    resolved call, a plain call that ran longer, is past it: a task)."""
    completed = record.completed_at if record.completed_at is not None else record.updated_at
    return completed - record.created_at <= policy.task_after


def _not_found() -> MCPError:
    return MCPError(code=INVALID_PARAMS, message=TASK_NOT_FOUND)


#: Submits a task-creating call of a durable tool for the request being served: `submit(name,
#: arguments, request)` is `DurableServer.submit_task` in that request's context.
TaskSubmitter = Callable[[str, dict[str, Any], ServerRequestContext[Any, Any]], Awaitable[CallRecord]]


class TaskProtocol:
    """Serves MCP tasks for one server (`host`), from its engine's journal.

    `DurableServer` wires it: `middleware` as a server middleware, `on_change` as an engine
    listener, and itself as the `protocol` of its `TasksExtension`.
    """

    def __init__(self, host: DurableHost, submit: TaskSubmitter) -> None:
        self.host = host
        self._submit = submit
        #: Legacy sessions that created a task, for `notifications/tasks/status` (best effort).
        self._watchers: dict[tuple[str, str], Any] = {}
        #: The questions (principal, task id, key) a 2025-11-25 `tasks/result` here is asking.
        self._asking: set[tuple[str, str, str]] = set()

    # -- shared -----------------------------------------------------------------------------------

    def _policy(self, record: CallRecord) -> ToolPolicy | None:
        return self.host.policies.get(record.identity.tool)

    def _principal(self, ctx: ServerRequestContext[Any, Any]) -> str:
        return self.host.request_principal(ctx)

    def task_support(self, name: object) -> str:
        policy = self.host.policies.get(name) if isinstance(name, str) else None
        return policy.task_support if policy is not None else "forbidden"

    def any_task_tools(self) -> bool:
        return any(p.task_support != "forbidden" for p in self.host.policies.values())

    async def _find(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> CallRecord:
        record = await self.host.engine.task(self._principal(ctx), task_id)
        if record is None:
            raise _not_found()
        return record

    async def _create(self, ctx: ServerRequestContext[Any, Any], name: str, arguments: dict[str, Any]) -> CallRecord:
        """Submit a task-creating call; refusals become JSON-RPC errors (there is no task to show
        them): `results.refusal_error`, as every method of the tasks answers a `DurableError`."""
        try:
            with refusals_as_jsonrpc():
                return await self._submit(name, arguments, ctx)
        except ValidationError as exc:
            fields = sorted({".".join(str(p) for p in e["loc"]) for e in exc.errors()})
            raise MCPError(code=INVALID_PARAMS, message=f"Invalid arguments for tool {name!r}: {fields}") from None

    # -- wire shapes (server/task_wire.py), with each record's tool policy ------------------------

    def legacy_task(self, record: CallRecord, inputs: dict[str, Any] | None = None) -> dict[str, Any]:
        return wire.legacy_task(record, self._policy(record), inputs)

    def modern_task(
        self, record: CallRecord, *, detailed: bool, inputs: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return wire.modern_task(record, self._policy(record), detailed=detailed, inputs=inputs)

    async def inputs(self, record: CallRecord) -> dict[str, Any]:
        """The questions of task `record` waiting for its requestor's answer, by key (empty for a
        tool that is not `interactive`, whose tasks never ask, and for a terminal task)."""
        policy = self._policy(record)
        if policy is None or not policy.interactive or task_view(record, policy).terminal:
            return {}
        return await self.host.engine.tasks.questions(record)

    # -- 2025-11-25: tools/call with params.task, initialize, tools/list ----------------------------

    async def middleware(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """Server middleware: the 2025-11-25 task surface, which a handler's result cannot carry,
        and 2026-07-28 task subscriptions."""
        if _modern(ctx):
            return await self._modern_request(ctx, call_next)
        if ctx.method == "tools/call":
            # (Decided here, not in a coroutine of its own: this is on every call's path.)
            params = ctx.params or {}
            if params.get("task") is not None and ctx.protocol_version in LEGACY_VERSIONS:
                return await self._legacy_task_call(ctx, params)
            self._refuse_task_required(params.get("name"))
            return await call_next(ctx)
        result = await call_next(ctx)
        self._advertise_legacy_tasks(ctx, result)
        return result

    async def _modern_request(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """A 2026-07-28 request: `subscriptions/listen` naming `notifications.taskIds` is served
        by `listen` (refusals as JSON-RPC errors); every other request goes on unchanged."""
        if ctx.method == "subscriptions/listen":
            wanted = ((ctx.params or {}).get("notifications") or {}).get("taskIds")
            if wanted is not None:
                with refusals_as_jsonrpc():
                    return await self.listen(ctx, wanted)
        return await call_next(ctx)

    async def _legacy_task_call(self, ctx: ServerRequestContext[Any, Any], params: Mapping[str, Any]) -> HandlerResult:
        """A 2025-11-25 `tools/call` with `params.task`: creates the task and answers `{"task": …}`
        (-32601 for a tool whose task support is "forbidden", -32602 for arguments that are not
        an object)."""
        name = params.get("name")
        if self.task_support(name) == "forbidden":
            raise MCPError(code=METHOD_NOT_FOUND, message=f"Tool {name!r} does not support task augmentation")
        arguments = params.get("arguments") or {}
        if not isinstance(arguments, dict):
            raise MCPError(code=INVALID_PARAMS, message="arguments must be an object")
        assert isinstance(name, str)
        record = await self._create(ctx, name, arguments)
        self._watch(ctx, record)
        return {"task": self.legacy_task(record)}

    def _refuse_task_required(self, name: Any) -> None:
        """A pre-2026-07-28 `tools/call` without `params.task` of a task-required tool is refused
        (-32601); any other goes on unchanged."""
        if self.task_support(name) == "required":
            raise MCPError(
                code=METHOD_NOT_FOUND,
                message=f"Tool {name!r} requires task augmentation (taskSupport: 'required')",
            )

    def _advertise_legacy_tasks(self, ctx: ServerRequestContext[Any, Any], result: HandlerResult) -> None:
        """Add the legacy task surface to a pre-2026-07-28 answer, in place: `capabilities.tasks`
        to `initialize` when any tool supports tasks, `execution.taskSupport` to each such tool
        of a 2025-11-25 `tools/list`. Any other answer is left as it is."""
        method = ctx.method
        if method == "initialize" and isinstance(result, dict) and self.any_task_tools():
            capabilities = result.setdefault("capabilities", {})
            capabilities["tasks"] = LEGACY_CAPABILITY
        elif method == "tools/list" and isinstance(result, dict) and ctx.protocol_version in LEGACY_VERSIONS:
            for tool in result.get("tools", ()):
                support = self.task_support(tool.get("name"))
                if support != "forbidden":
                    tool["execution"] = {**tool.get("execution", {}), "taskSupport": support}

    def _watch(self, ctx: ServerRequestContext[Any, Any], record: CallRecord) -> None:
        if record.task_id is not None and not task_view(record, self._policy(record)).terminal:
            if len(self._watchers) >= MAX_WATCHED:  # a task that ended elsewhere never says so here
                del self._watchers[next(iter(self._watchers))]
            self._watchers[(record.identity.principal, record.task_id)] = ctx.session

    def on_change(self, record: CallRecord) -> None:
        """Engine listener: `notifications/tasks/status` to the legacy session that created the task.

        Synchronous: it never yields between a claim and the run; the send goes to a task."""
        if record.task_id is None or not self._watchers:
            return
        watcher = (record.identity.principal, record.task_id)
        session = self._watchers.get(watcher)
        if session is None:
            return
        task = self.legacy_task(record)
        if task["status"] in ("completed", "failed", "cancelled"):
            del self._watchers[watcher]
        notification = TaskStatusNotification(params=TaskStatusNotificationParams.model_validate(task))

        async def send() -> None:
            with anyio.move_on_after(5):
                await session.send_notification(cast(Any, notification))

        self.host.engine.spawn(send())

    # -- tasks/* ----------------------------------------------------------------------------------

    def _check_modern(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> None:
        """2026-07-28: the request must declare the extension (-32021) and name the task in Mcp-Name."""
        require_client_extension(ctx, TASKS_EXTENSION)
        request = ctx.request
        headers = getattr(request, "headers", None)
        named = headers.get("mcp-name") if headers is not None else None
        if named is not None and named != task_id:
            raise MCPError(code=HEADER_MISMATCH, message="Mcp-Name header does not match params.taskId")

    async def get(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        if _modern(ctx):
            self._check_modern(ctx, params.task_id)
        record = await self._find(ctx, params.task_id)
        self.host.engine.nudge_task(record, self._policy(record))
        inputs = await self.inputs(record)
        if _modern(ctx):
            return self.modern_task(record, detailed=True, inputs=inputs)
        return self.legacy_task(record, inputs)

    async def result(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        """2025-11-25 `tasks/result`: blocks until the task is terminal, then answers its result.

        While the task waits for input, each of its questions is sent to the client on this
        request's stream (`elicitation/create`, … with the related-task `_meta`) and the answer
        journaled; a question another `tasks/result` is asking already, or one this client could
        not answer (an error), is left to be answered elsewhere."""
        unanswerable: set[str] = set()
        while True:
            record = await self._find(ctx, params.task_id)
            policy = self._policy(record)
            if task_view(record, policy).terminal:
                return wire.legacy_payload(record, policy)
            self.host.engine.nudge_task(record, policy)
            inputs = {k: q for k, q in (await self.inputs(record)).items() if k not in unanswerable}
            asked = await self._ask_requestor(ctx, record, inputs, unanswerable) if inputs else False
            if not asked:
                await self.host.engine.journal.wait_for_change(record.identity, 1.0 if not inputs else 0.25)

    async def _ask_requestor(
        self, ctx: ServerRequestContext[Any, Any], record: CallRecord, inputs: dict[str, Any], failed: set[str]
    ) -> bool:
        """Send the task's questions `inputs` to the client of `ctx` (2025-11-25, on its
        `tasks/result` stream) one after another and journal each answer; True if any was sent.
        A question being asked by another request here is skipped; a key the client answered
        with an error (or could not be asked) goes to `failed`."""
        assert record.task_id is not None
        sent = False
        for key, question in inputs.items():
            asking = (record.identity.principal, record.task_id, key)
            if asking in self._asking:
                continue
            self._asking.add(asking)
            try:
                params = dict(question.get("params") or {})
                params["_meta"] = {**params.get("_meta", {}), RELATED_TASK: {"taskId": record.task_id}}
                request = _Question(method=question["method"], params=params)
                try:
                    answer = await ctx.session.send_request(
                        cast(Any, request), _Answer, metadata=ServerMessageMetadata(related_request_id=ctx.request_id)
                    )
                except (MCPError, NoBackChannelError, ValidationError) as exc:
                    logger.info("task %s: the client did not answer %s: %s", record.task_id, key, exc)
                    failed.add(key)
                    continue
                sent = True
                await self.host.engine.tasks.answer(record, {key: answer.model_extra or {}})
            finally:
                self._asking.discard(asking)
        return sent

    async def list(self, ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams) -> dict[str, Any]:
        """2025-11-25 `tasks/list`: the caller's own tasks, newest first, paginated."""
        principal = self._principal(ctx)
        cursor = wire.decode_cursor(principal, params.cursor) if params.cursor else None
        page = await self.host.engine.journal.list_calls(
            CallQuery(principal=principal, tasks_only=True, limit=LIST_PAGE + 1, cursor=cursor)
        )
        now = self.host.engine.clock()
        tasks = [self.legacy_task(r) for r in page[:LIST_PAGE] if not r.is_expired(now)]
        out: dict[str, Any] = {"tasks": tasks}
        if len(page) > LIST_PAGE:
            out["nextCursor"] = wire.encode_cursor(page[LIST_PAGE - 1])
        return out

    async def cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        """`tasks/cancel`, one rule in both generations: a task whose status is terminal
        (completed, failed — in doubt under `refuse`, parked, its reconcile hook failed — or
        cancelled) is left exactly as it is; any other task is recorded `cancelled` and its tool
        stopped. Only the answer differs: 2025-11-25 gives the cancelled task, and -32602 for a
        terminal one; 2026-07-28 acknowledges with an empty result either way (idempotent).

        The terminal check is the face's own, on the status the requestor sees: an in-doubt
        record is not final to the engine, but its `failed` task must not become `cancelled`,
        which would end the refusal that keeps its key from running a second time. The engine's
        `cancel_task` refuses such a record too, atomically with its write: a task that turns
        terminal between this read and that write is caught there.
        """
        modern = _modern(ctx)
        if modern:
            self._check_modern(ctx, params.task_id)
        found = await self._find(ctx, params.task_id)
        policy = self._policy(found)
        if task_view(found, policy).terminal:
            return self._cancel_refused(found, modern)
        retention = policy.retention if policy is not None else None
        record, changed = await self.host.engine.cancel_task(self._principal(ctx), params.task_id, retention)
        if record is None:
            raise _not_found()
        if not changed:
            return self._cancel_refused(record, modern)
        if modern:
            return {}  # an acknowledgement; the status is what the next tasks/get shows
        return self.legacy_task(record)

    def _cancel_refused(self, record: CallRecord, modern: bool) -> dict[str, Any]:
        """The answer to cancelling a task that is terminal (nothing was changed): 2026-07-28's
        empty acknowledgement, 2025-11-25's -32602 naming the status the task keeps."""
        if modern:
            return {}
        status = self.legacy_task(record)["status"]
        raise MCPError(code=INVALID_PARAMS, message=f"Cannot cancel task: already in terminal status '{status}'")

    async def update(self, ctx: ServerRequestContext[Any, Any], params: TaskUpdateParams) -> dict[str, Any]:
        """2026-07-28 `tasks/update`: journal the answers (`inputResponses`) to questions of the
        task still waiting for one, and acknowledge; answers to other keys (answered already, never
        asked) are ignored. An answer that is not a result of its question's method is refused
        (-32602) and nothing of the request is journaled."""
        self._check_modern(ctx, params.task_id)
        record = await self._find(ctx, params.task_id)
        responses = params.input_responses or {}
        waiting = await self.inputs(record) if responses else {}
        answers: dict[str, dict[str, Any]] = {}
        for key, response in responses.items():
            question = waiting.get(key)
            if question is None:
                continue
            model = ANSWER_MODELS.get(question.get("method", ""))
            try:
                checked = model.model_validate(response, by_name=False) if model is not None else None
            except ValidationError:
                raise MCPError(
                    code=INVALID_PARAMS, message=f"inputResponses[{key!r}] is not a result of {question['method']}"
                ) from None
            if checked is not None:
                answers[key] = checked.model_dump(by_alias=True, mode="json", exclude_none=True)
            elif isinstance(response, dict):
                answers[key] = response
        if answers:
            await self.host.engine.tasks.answer(record, answers)
        return {}

    # -- 2026-07-28: task notifications on subscriptions/listen ------------------------------------

    async def listen(self, ctx: ServerRequestContext[Any, Any], wanted: object) -> dict[str, Any]:
        """Serve a listen stream for tasks: ack the caller's own tasks among `wanted`, then send
        `notifications/tasks` whenever one changes (read from the journal, so a change made on
        another replica is seen too), and end the stream once every one is terminal."""
        require_client_extension(ctx, TASKS_EXTENSION)
        if ctx.request_id is None or not isinstance(wanted, list) or not all(isinstance(t, str) for t in wanted):
            raise MCPError(code=INVALID_PARAMS, message="notifications.taskIds must be a list of task ids")
        meta = {SUBSCRIPTION_ID_META_KEY: ctx.request_id}
        principal = self._principal(ctx)
        records = {t: r for t in dict.fromkeys(wanted) if (r := await self.host.engine.task(principal, t))}
        ack = wire.Notification(
            method="notifications/subscriptions/acknowledged",
            params={"notifications": {"taskIds": list(records)}, "_meta": meta},
        )
        await ctx.session.send_notification(cast(Any, ack), related_request_id=ctx.request_id)
        sent: dict[str, tuple[str, float, tuple[str, ...]]] = {}
        while True:
            for task_id, record in records.items():
                inputs = await self.inputs(record)
                view = task_view(record, self._policy(record), waiting=bool(inputs))
                state = (view.status, record.updated_at, tuple(inputs))
                if sent.get(task_id) != state:
                    sent[task_id] = state
                    params = {**self.modern_task(record, detailed=True, inputs=inputs), "_meta": meta}
                    note = wire.Notification(method="notifications/tasks", params=params)
                    await ctx.session.send_notification(cast(Any, note), related_request_id=ctx.request_id)
            if all(task_view(r, self._policy(r)).terminal for r in records.values()):
                return {"resultType": "complete", "_meta": meta}  # the middleware owns the envelope
            running = next(r for r in records.values() if not task_view(r, self._policy(r)).terminal)
            await self.host.engine.journal.wait_for_change(running.identity, 0.5)
            for task_id in list(records):
                records[task_id] = await self.host.engine.task(principal, task_id) or records[task_id]

    # -- 2026-07-28: server-directed creation -----------------------------------------------------

    async def intercept(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        policy = _task_policy(self.host, params.name, ctx)
        if policy is None:
            return await call_next(ctx)
        capabilities = ctx.session.client_capabilities
        declared = capabilities is not None and TASKS_EXTENSION in (capabilities.extensions or {})
        if not declared:
            if policy.task_support == "required":
                require_client_extension(ctx, TASKS_EXTENSION)  # raises -32021
            return await call_next(ctx)
        try:
            record = await self._create(ctx, params.name, params.arguments or {})
        except TaskInputFirst as first:
            return first.result  # a round of questions before the task: no task yet
        finished_before = record.state.is_final  # a repeat of a finished call: a replay
        if finished_before and policy.task_support == "optional" and not _finished_within(record, policy):
            # Its first caller got the task (the run outlasted `task_after`): so does every repeat,
            # the same task id, its result read by tasks/get like the first caller's.
            return {"resultType": "task", **self.modern_task(record, detailed=False)}
        if policy.task_support == "optional" and policy.task_after > 0:
            record = await self._settle(record, policy.task_after)
        if has_task_result(record) and policy.task_support == "optional":
            # Finished within `task_after` (of this call, or of the first call a repeat repeats):
            # the plain result, as a call without tasks gets it (a released error result too).
            return answer(
                CallOutcome(
                    record.identity.key,
                    None,
                    record.result,
                    replayed=finished_before,
                    first_completed_at=record.completed_at,
                    attempt=record.attempts,
                )
            )
        return {"resultType": "task", **self.modern_task(record, detailed=False)}

    async def _settle(self, record: CallRecord, seconds: float) -> CallRecord:
        """Wait up to `seconds` for the task to end; the latest record."""
        assert record.task_id is not None
        principal, task_id = record.identity.principal, record.task_id
        with anyio.move_on_after(seconds):
            while not task_view(record, self._policy(record)).terminal:
                await self.host.engine.journal.wait_for_change(record.identity, 0.25)
                record = await self.host.engine.task(principal, task_id) or record
        return record


class TasksExtension(Extension):
    """The `io.modelcontextprotocol/tasks` extension: `tasks/*` methods and task-creating calls."""

    identifier = TASKS_EXTENSION

    def __init__(self) -> None:
        self.protocol: TaskProtocol | None = None  # bound by DurableServer once its engine exists

    def _bound(self) -> TaskProtocol:
        if self.protocol is None:
            raise MCPError(code=INTERNAL_ERROR, message="tasks are not set up on this server")
        return self.protocol

    def methods(self) -> Sequence[MethodBinding]:
        # A `DurableError` (the journal failing under a read, a cancel) is answered by every
        # method as `results.refusal_error`, the JSON-RPC error a resource read gets too.
        async def get(ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> HandlerResult:
            with refusals_as_jsonrpc():
                return await self._bound().get(ctx, params)

        async def result(ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> HandlerResult:
            with refusals_as_jsonrpc():
                return await self._bound().result(ctx, params)

        async def list_tasks(ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams) -> HandlerResult:
            with refusals_as_jsonrpc():
                return await self._bound().list(ctx, params)

        async def cancel(ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> HandlerResult:
            with refusals_as_jsonrpc():
                return await self._bound().cancel(ctx, params)

        async def update(ctx: ServerRequestContext[Any, Any], params: TaskUpdateParams) -> HandlerResult:
            with refusals_as_jsonrpc():
                return await self._bound().update(ctx, params)

        modern = frozenset(MODERN_PROTOCOL_VERSIONS)
        return (
            MethodBinding("tasks/get", TaskIdParams, get),
            MethodBinding("tasks/cancel", TaskIdParams, cancel),
            MethodBinding("tasks/result", TaskIdParams, result, protocol_versions=LEGACY_VERSIONS),
            MethodBinding("tasks/list", PaginatedRequestParams, list_tasks, protocol_versions=LEGACY_VERSIONS),
            MethodBinding("tasks/update", TaskUpdateParams, update, protocol_versions=modern),
        )

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        return await self._bound().intercept(params, ctx, call_next)


def skip_idle_interceptor(
    extensions: Sequence[Extension], composed: RequestHandler, bare: RequestHandler, host: DurableHost
) -> RequestHandler:
    """The `tools/call` handler to register: `composed` (the SDK's chain of interceptors around
    `bare`) only for a call `TasksExtension.intercept` can act on, `bare` for every other.

    `intercept` passes a call straight on unless `_task_policy` finds it may become a task (the
    one test both use); the chain still costs every call three coroutine layers. When another
    extension intercepts tool calls too, every call goes through `composed`, as the SDK composes it.
    """
    others = [
        e
        for e in extensions
        if not isinstance(e, TasksExtension) and type(e).intercept_tool_call is not Extension.intercept_tool_call
    ]
    if others:
        return composed

    async def call_tool(ctx: ServerRequestContext[Any, Any], params: CallToolRequestParams) -> HandlerResult:
        if _task_policy(host, params.name, ctx) is None:
            return await bare(ctx, params)
        return await composed(ctx, params)

    return call_tool
