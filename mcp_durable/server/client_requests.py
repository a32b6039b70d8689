"""A durable call that must not ask its client, and the registration checks that go with it.

A call journaled under a key its caller did not give (derived from the arguments, or by
`key_fields`/`key_fn`) is answered to every later call with that key, from any session: were the
tool to ask its client (elicitation, sampling, roots) during it, one session's answers would be
replayed to another. Such a call's session refuses every request to the client
(`ClientRequestWithoutKeyError`, released, never kept); an `interactive` tool is journaled only
under its caller's key.

An `interactive` tool run as a task asks its task's requestor instead: its session is a
`TaskSession` (`task_request`, `task_context`), used by `DurableServer` and by FastMCP's durable
tasks (`mcp_durable/fastmcp/tasks.py`) alike.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import resolve_arguments
from mcp.server.mcpserver.tools import Tool
from mcp.server.session import ServerSession
from mcp_types import CallToolRequestParams, ClientCapabilities, InitializeRequestParams, InputRequiredResult
from pydantic import BaseModel, ValidationError

from .. import keys
from ..errors import ClientRequestWithoutKeyError
from ..policy import ToolPolicy
from ..steps import current_call
from .calls import caller_meta
from .sdk_internals import subscription_bus

logger = logging.getLogger(__name__)


#: The session methods that send a request to the client (and wait for its answer).
_CLIENT_REQUESTS = frozenset({"send_request", "create_message", "list_roots", "elicit", "elicit_form", "elicit_url"})


class ClientRequestsRefused:
    """A request's session for a tool that must not ask its client: each request to the client
    raises `ClientRequestWithoutKeyError` before anything is sent; the rest (notifications,
    progress, capabilities) is the session's own."""

    def __init__(self, session: Any, tool: str) -> None:
        self._refusing_session = session
        self._refusing_tool = tool

    def __getattr__(self, name: str) -> Any:
        if name in _CLIENT_REQUESTS:
            return self._refuse
        return getattr(self._refusing_session, name)

    async def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise ClientRequestWithoutKeyError(self._refusing_tool)


def asking_refused(policy: ToolPolicy, arguments: Mapping[str, Any], context: Context[Any, Any] | None) -> bool:
    """Whether a journaled call of a tool under `policy` must not ask its client: its key is not
    its caller's (no key in `_meta`, none in `key_argument`) and the tool is not `interactive`
    (whose calls without a caller key are never journaled). False without a request (no client)."""
    if context is None or policy.interactive:
        return False
    meta = caller_meta(context) or {}
    if keys.KEY_META in meta or any(name in meta for name in policy.key_meta):
        return False
    return policy.key_argument is None or arguments.get(policy.key_argument) is None


def without_client_requests(
    server: MCPServer[Any], tool: str, context: Context[Any, Any] | None
) -> Context[Any, Any] | None:
    """`context` whose session refuses every request to the client (`ClientRequestsRefused`),
    for a call journaled under a key its caller did not give; `context` itself without a request."""
    try:
        request = context.request_context if context is not None else None
    except ValueError:  # a Context made outside a request: there is no client to ask
        return context
    if request is None:
        return context
    guarded = dataclasses.replace(request, session=cast(Any, ClientRequestsRefused(request.session, tool)))
    raw = request.params
    params = None
    if raw is not None and ("inputResponses" in raw or "requestState" in raw):
        try:  # the call's own params, for the tool's `input_responses` (2026-07-28 multi-round calls)
            params = CallToolRequestParams.model_validate(raw)
        except ValidationError:
            params = None
    return Context(
        request_context=guarded, mcp_server=server, input_params=params, subscriptions=subscription_bus(server)
    )


#: Asks the requestor of the running task a question (`{"method", "params"}`) and returns its
#: answer: `TaskRuns.ask` for the durable call being run.
Asker = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]

#: The protocol version a task's tool is told it speaks: a handshake version, on which the SDK
#: (`ctx.elicit`, `Resolve` parameters) sends each question as a request to the client, which
#: the task's session journals (2026-07-28 would make resolvers answer `input_required` instead).
TASK_PROTOCOL_VERSION = "2025-11-25"


def question_of(request: BaseModel) -> dict[str, Any]:
    """A request to the client (`ElicitRequest`, `CreateMessageRequest`, `ListRootsRequest`) as a
    task's question is journaled and shown: `{"method", "params"}` (no `params` when empty)."""
    data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
    question: dict[str, Any] = {"method": data["method"]}
    if data.get("params"):
        question["params"] = data["params"]
    return question


class TaskSession(ServerSession):
    """The session of an interactive tool run as a task: each request to the client
    (`elicit_form`, `create_message`, `list_roots`, `send_request`) is asked of the task's
    requestor through `ask` and waits for the answer; notifications and progress have no request
    to ride and are dropped.

    `can_send_request` is False: the SDK then asks without checking the client's capabilities,
    which a task resumed after a restart does not know (its requestor answers or it waits)."""

    def __init__(self, ask: Asker, protocol_version: str = TASK_PROTOCOL_VERSION) -> None:
        # No connection: the task outlives the request that created it.
        self._ask = ask
        self._task_protocol_version = protocol_version
        self._log_is_request_scoped = True
        self._allowed_log_levels = frozenset()

    @property
    def client_params(self) -> InitializeRequestParams | None:
        return None

    @property
    def client_capabilities(self) -> ClientCapabilities | None:
        return None

    @property
    def can_send_request(self) -> bool:
        return False

    @property
    def protocol_version(self) -> str:
        return self._task_protocol_version

    def check_client_capability(self, capability: ClientCapabilities) -> bool:
        return False

    async def send_request(self, request: Any, result_type: Any, *args: Any, **kwargs: Any) -> Any:
        answer = await self._ask(question_of(request))
        return result_type.model_validate(answer, by_name=False)

    async def send_notification(self, notification: Any, related_request_id: Any = None) -> None:
        return None

    async def _notify(self, notification: Any, *, request_scoped: bool) -> None:
        return None

    async def report_progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        return None


def task_request(
    ask: Callable[[Any, dict[str, Any]], Awaitable[dict[str, Any]]],
    request: ServerRequestContext[Any, Any] | None = None,
    *,
    params: Mapping[str, Any] | None = None,
    protocol_version: str = TASK_PROTOCOL_VERSION,
) -> ServerRequestContext[Any, Any]:
    """The low-level request context of an interactive tool run as a task (`task_context`, and a
    FastMCP tool's in `fastmcp/tasks.py`): its session is a `TaskSession` asking through
    `ask(call, question)` for the durable call being run (`TaskRuns.ask`).

    `request`: the request that created the task (None for a task resumed from the journal), whose
    lifespan state is kept. `params`: the `tools/call` params the run sees as its request's (a
    FastMCP tool reads its `inputResponses` / `requestState` there). `protocol_version`: the
    version the tool is told it speaks (a handshake version: its questions are requests)."""

    async def asked(question: dict[str, Any]) -> dict[str, Any]:
        return await ask(current_call(), question)

    return ServerRequestContext[Any, Any](
        session=TaskSession(asked, protocol_version),
        lifespan_context=request.lifespan_context if request is not None else {},
        protocol_version=protocol_version,
        method="tools/call",
        params=params,
        request_id="task",
    )


def task_context(
    server: MCPServer[Any],
    ask: Callable[[Any, dict[str, Any]], Awaitable[dict[str, Any]]],
    request: ServerRequestContext[Any, Any] | None = None,
    input_params: CallToolRequestParams | None = None,
) -> Context[Any, Any]:
    """The context of an interactive tool run as a task: its session is a `TaskSession` asking
    through `ask(call, question)` for the durable call being run (`TaskRuns.ask`).

    `request` is the request that created the task (None for a task resumed from the journal):
    its lifespan state is kept. `input_params`: the answers a 2026-07-28 request gathered before
    the task was created (multi-round `tools/call`, SEP-2322), which the tool's `Resolve`
    parameters read on its first run; the context then speaks that request's protocol version.
    """

    version = request.protocol_version if request is not None and input_params is not None else TASK_PROTOCOL_VERSION
    context = task_request(ask, request, protocol_version=version)
    return Context(
        request_context=context, mcp_server=server, input_params=input_params, subscriptions=subscription_bus(server)
    )


def input_params(request: ServerRequestContext[Any, Any]) -> CallToolRequestParams | None:
    """The `tools/call` params of `request` when they answer an earlier round (`inputResponses`,
    `requestState`: a 2026-07-28 multi-round call); None otherwise."""
    raw = request.params
    if raw is None or not ("inputResponses" in raw or "requestState" in raw):
        return None
    try:
        return CallToolRequestParams.model_validate(raw)
    except ValidationError:
        return None


async def first_round(
    server: MCPServer[Any], tool: Tool, arguments: dict[str, Any], request: ServerRequestContext[Any, Any]
) -> InputRequiredResult | None:
    """For a task-creating 2026-07-28 call of a tool with `Resolve` parameters: the questions its
    resolvers still have for this request (an `InputRequiredResult`, answered before any task is
    created: SEP-2663's MRTR composition), or None once this request's answers satisfy them."""
    if not tool.resolved_params:
        return None
    context = Context(
        request_context=request,
        mcp_server=server,
        input_params=input_params(request),
        subscriptions=subscription_bus(server),
    )
    validated = tool.fn_metadata.validate_arguments(arguments)
    resolved = await resolve_arguments(tool.resolved_params, tool.resolver_plans, validated, context)
    return resolved if isinstance(resolved, InputRequiredResult) else None


def warn_if_interactive_undeclared(name: str, policy: ToolPolicy, fn: Callable[..., Any]) -> None:
    """Log a warning for a tool whose parameters the SDK resolves from the client (`Resolve`:
    elicitation, sampling, roots) under a policy that may derive its key: a call of it without a
    caller key is refused at run time (`ClientRequestWithoutKeyError`), as a derived key would
    replay one session's answers to another. (A tool calling `ctx.elicit` itself cannot be seen
    from here; its calls are refused alike.)"""
    if policy.interactive or not (policy.key == "derived" or policy.key_fields or policy.key_fn):
        return  # keyed by its caller only (or refused without a key): no answer replays to another session
    try:
        from mcp.server.mcpserver.resolve import find_resolved_parameters
    except ImportError:  # pragma: no cover - an SDK without resolvers
        return
    try:
        resolved = find_resolved_parameters(fn)
    except Exception:  # noqa: BLE001 - the SDK reports a bad signature itself
        return
    if resolved:
        logger.warning(
            "durable tool %r resolves %s from the client (elicitation/sampling) but its policy may derive "
            "its key: its calls without a caller key will be refused (missing_key), since a derived key would "
            "replay one session's answers to another; declare ToolPolicy(interactive=True)",
            name,
            ", ".join(sorted(resolved)),
        )
