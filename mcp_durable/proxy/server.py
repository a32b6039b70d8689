"""`ProxyServer`: a durable face whose tools, resources and prompts are another server's.

An `MCPServer` composing the same durable parts as `DurableServer` (server/assembly.py's
`DurableFace`: engine, call path, journal resources, admin tools, background jobs), with an
upstream runner where `DurableServer` has Python functions. Every request is forwarded to the
upstream (`Upstream`) and its answer returned unchanged, except `tools/call` of a tool whose
policy (`Policies`: the file, else the upstream's own `idempotentHint`) makes it durable: that
goes through `DurableCalls.run`, the same engine path as a Python durable tool, with a `run`
that forwards the call upstream carrying the scoped key in `_meta["mcp-durable/idempotency-key"]`.
The journal resources (`journal://…`) and the admin tools are the proxy's own. Subscriptions to
the upstream's resources and its list changes are relayed to the clients that asked for them
(subscriptions.py); its tools are listed again when it says they changed.

A client sees what it would see talking to the upstream directly: each request of a client
(`tools/list` and the other listings, `tools/call`, `prompts/get`, `resources/read`,
completions) goes through the upstream session of the capabilities it declared (upstream.py's
`Upstream.session`, router.py's `declared_by`: a 2026-07-28 client declares none), so the
upstream lists it the tools it lists such a client, and asks it (sampling, elicitation) only
what it could ask it directly. The policies are by tool name, applied to each session's listing
alike; the journal and keys do not depend on the session, so a key's effect happens once
whichever session runs it. A task's run, with no client waiting on it, goes through the
no-capability session (first run and resume alike).

MCP tasks (both generations, server/tasks.py) are the proxy's own too: a durable tool whose policy
has `task_support` (the policies file, else the upstream's own `execution.taskSupport`) is
advertised with it, and a task of it is a journaled call whose run forwards a plain `tools/call`
upstream in the background, with the scoped key, exactly as a durable call does; for a tool the
upstream serves only as a task (`required`), the run is the upstream's own task instead
(upstream_tasks.py, on a 2025-11-25 upstream session). A task in doubt after a restart is resumed
by its in-doubt policy the same way. A tool the proxy serves no task for is listed without
`execution.taskSupport`.

Upstream faults:
- cannot be reached (not started, refused, timed out): a repeat of a key whose result is
  journaled is answered from the journal all the same (only a miss needs the upstream); any
  other call is refused with `upstream_unavailable` before any claim, so nothing is journaled;
- died with the call outstanding: the effect may have happened, so the record is left
  IN_DOUBT (`OutcomeUnknownError`) and the tool's in-doubt policy answers its repeats; the
  next call restarts a stdio upstream;
- answered with a JSON-RPC error: taken like a Python tool raising `MCPError`, by the tool's
  `exceptions` policy (`DurableCalls.protocol_error_outcome`): `release` (the default) releases
  the claim and the error reaches the client as the upstream sent it; `persist` journals it as
  an `isError` result that every repeat of the key replays. An error asking the client to act
  and call again (URL elicitation required) is released under either;
- answered with an `isError` result: an SDK-built upstream answers an exception (a transient
  crash) that way, so for a proxied tool it is released by default (`tool_errors = "release"`,
  a retry runs again) and kept only where the policies file says `tool_errors = "persist"`;
- did not answer within the call's timeout (the policy's `timeout` for a durable call, which the
  engine enforces; `UpstreamSpec.call_timeout` for a pass-through one): that call alone is
  abandoned, in doubt (durable) or answered with a timeout error (pass-through); the shared
  session and the other calls on it go on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractContextManager, asynccontextmanager
from dataclasses import replace
from typing import Any

import anyio
import orjson
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    REQUEST_TIMEOUT,
    CallToolResult,
    CompleteRequestParams,
    CompleteResult,
    EmptyResult,
    GetPromptResult,
    InputRequiredResult,
    ListPromptsResult,
    ListResourcesResult,
    ListResourceTemplatesResult,
    ListToolsResult,
    Prompt,
    ReadResourceRequestParams,
    ReadResourceResult,
    Resource,
    ResourceTemplate,
    SetLevelRequestParams,
    Tool,
    ToolAnnotations,
)
from mcp_types.jsonrpc import METHOD_NOT_FOUND

from .. import keys, limits
from ..engine import Encoder, Engine, Runner, ToolOutcome
from ..errors import DurableError, OutcomeUnknownError, UpstreamUnavailableError
from ..journal import CallRecord, Journal
from ..journal.model import CallIdentity, CallState
from ..keys import KEY_META
from ..policy import ErrorHandling, TaskSupport, ToolPolicy
from ..policy_file import Policies
from ..server.assembly import DurableFace, FaceOptions
from ..server.calls import caller_meta
from ..server.lifetime import Occupancy
from ..server.results import refusal_error
from ..server.sdk_internals import lowlevel_server, registered_tool, subscription_bus
from ..steps import DurableCall
from ..tasks import in_doubt_refused
from ..uris import SCHEME
from . import upstream_tasks
from .router import NO_CAPABILITIES, Capabilities, declared_by
from .subscriptions import UpstreamSubscriptions
from .upstream import Upstream, UpstreamLost, UpstreamSession, UpstreamSpec, UpstreamTimedOut

logger = logging.getLogger(__name__)

#: The proxy's own resources; every other URI is the upstream's.
LOCAL_SCHEME = SCHEME
_RESERVED_META = "io.modelcontextprotocol/"


class ProxyServer(MCPServer[Any]):
    """Serves `upstream` with durable tools by `policies`. The keyword arguments are
    `DurableServer`'s durable options (`journal`, `tokens`, `admin_principals`, …; see
    `FaceOptions.build`) and `MCPServer`'s own; the proxy's lifespan is its own."""

    def __init__(
        self, upstream: UpstreamSpec, policies: Policies | None = None, name: str | None = None, **kwargs: Any
    ) -> None:
        self.upstream = Upstream(upstream)
        self.tool_policies = policies or Policies()
        #: Tools whose `tool_errors` the policies chose; the others get the proxy's default.
        self._tool_errors_chosen = _tool_errors_chosen(self.tool_policies)
        #: Whether the upstream session can run the upstream's own tasks (2025-11-25), for tools
        #: it serves only as tasks (`upstream_tasks`); known once connected.
        self._upstream_tasks = True
        #: Connections inside `_lifespan` now; the upstream is served while any is.
        self._upstream_users = Occupancy()
        #: Per upstream session, its listing of the tools the policies were last applied to
        #: (`UpstreamSession.listings`).
        self._applied_listing: dict[Capabilities, int] = {}
        #: The task running the upstream's supervisor, from the first connection to the last.
        self._supervisor: asyncio.Task[None] | None = None
        #: Set while the supervisor runs (a new event for each time it is started).
        self._supervising = anyio.Event()
        #: Tasks being resumed here now (`_resume_task`): a second nudge of one waits for nothing.
        self._resuming: set[CallIdentity] = set()
        options, rest = FaceOptions.split(kwargs)
        sdk_kwargs = options.sdk_kwargs(rest, 0)
        super().__init__(name or "mcp-durable-proxy", lifespan=self._lifespan, **sdk_kwargs)
        #: The durable parts (server/assembly.py), as `DurableServer` composes them.
        self.face = DurableFace(
            self,
            options,
            submit_task=self._submit_task,
            resume_task=self._resume_task,
            result_encoder=_no_encoder,
            output_schema_of=self.output_schema_of,
            sdk_kwargs=sdk_kwargs,
        )
        self.calls = self.face.calls
        #: Subscriptions to the upstream's resources, and its notifications relayed (subscriptions.py).
        self.subscriptions = UpstreamSubscriptions(self.upstream, subscription_bus(self), self._tools_changed)
        self.upstream.on_notification = self.subscriptions.relay
        self._install_forwarding()

    @property
    def engine(self) -> Engine:
        return self.face.engine

    @property
    def journal(self) -> Journal:
        return self.face.engine.journal

    @property
    def policies(self) -> dict[str, ToolPolicy]:
        """The durable tools' policies by name, as applied to the upstream's tools last listed."""
        return self.face.policies

    @property
    def principal_of(self) -> Callable[[Context[Any, Any] | None], str]:
        return self.face.principal_of

    # -- the proxy's lifetime: the engine's, and the upstream's inside it --------------------------

    @asynccontextmanager
    async def _lifespan(self, app: MCPServer[Any]) -> AsyncIterator[dict[str, Any]]:
        # Entered once per stdio/in-memory connection (each in its own task, leaving in any
        # order) and once by the HTTP session manager: the engine and the upstream are served
        # from the first entry to the last exit, whichever connections those are.
        async with self.face.lifetime.served():
            first = self._upstream_users.enter()
            try:
                if first:
                    await self._start_supervisor()
                    try:
                        await self.refresh()  # list the upstream's tools now: policies, and an early error
                    except UpstreamUnavailableError as exc:
                        logger.warning("%s", exc)
                yield {}
            finally:
                if self._upstream_users.leave():
                    await self._stop_supervisor()

    async def _start_supervisor(self) -> None:
        """Run `Upstream.supervise` in a task of its own, until `_stop_supervisor`; returns once
        it has started.

        Not in a task group of the connection that started it: anyio ties a task group to the
        task that entered it, and that connection may leave before the others. The supervisor's
        own task enters and leaves the SDK client, as anyio requires.
        """
        if self._supervisor is not None:
            return
        started = anyio.Event()

        async def supervise() -> None:
            async with anyio.create_task_group() as group:
                await group.start(self.upstream.supervise)
                started.set()

        self._supervisor = asyncio.get_running_loop().create_task(supervise(), name=f"{self.name} upstream")
        await started.wait()
        self._supervising.set()

    async def _stop_supervisor(self) -> None:
        """Close the upstream session (and a stdio child) and wait until the supervisor has ended."""
        running, self._supervisor = self._supervisor, None
        self._supervising = anyio.Event()
        self.upstream.stop()
        if running is not None:
            with anyio.CancelScope(shield=True):  # the last connection leaving may itself be cancelled
                await asyncio.gather(running, return_exceptions=True)

    async def refresh(self, capabilities: Capabilities = NO_CAPABILITIES) -> list[Tool]:
        """Connect the session of `capabilities` if needed and apply the policies to the tools it
        last listed (the policies are by tool name, for every session alike)."""
        session = self.upstream.session(capabilities)
        self._upstream_tasks = upstream_tasks.supported(await session.client())
        self._applied_listing[capabilities] = session.listings
        tools = list(session.tools.values())
        for tool in tools:
            policy = self.tool_policies.for_tool(tool.name, _annotations(tool))
            if policy is not None and tool.name not in self._tool_errors_chosen:
                # An upstream built on an SDK answers an exception (a crash, a dependency down
                # for a moment) with an `isError` result, indistinguishable from a deliberate
                # one: kept, it would answer every retry of the key with a transient failure.
                policy = replace(policy, tool_errors=PROXY_TOOL_ERRORS)
            policy = self._with_task_support(tool, policy)
            if policy is None:
                self.policies.pop(tool.name, None)
            else:
                self.policies[tool.name] = policy
        unknown = self.tool_policies.unknown(session.tools)
        if unknown:
            logger.warning(
                "policies name tools the upstream does not list to a client declaring %s: %s",
                capabilities.describe(),
                ", ".join(unknown),
            )
        return tools

    def _with_task_support(self, tool: Tool, policy: ToolPolicy | None) -> ToolPolicy | None:
        """`policy` with the task support the proxy serves for `tool`: the policies' own, else the
        upstream's declaration where the proxy can serve it (`optional`: a plain call of the tool
        is valid upstream, which is what a task's run forwards; `required`: a task's run is the
        upstream's own task, on a 2025-11-25 session)."""
        declared = _declared_task_support(tool)
        if declared == "required" and (policy is None or not self._upstream_tasks):
            # A plain call of it is refused upstream, and there is no task of it to run it as.
            logger.warning(
                "upstream tool %r runs only as an MCP task (taskSupport 'required'): %s, so its calls "
                "are refused there (docs/proxy.md)",
                tool.name,
                "it is not durable here" if policy is None else "the upstream session speaks 2026-07-28",
            )
            declared = None
        if policy is None or declared is None or self.tool_policies.chose(tool.name, "task_support"):
            return policy
        # `optional`: a task's run is a plain call upstream; `required`: the upstream's own task.
        return replace(policy, task_support=declared)

    # -- tools -------------------------------------------------------------------------------------

    async def list_tools(self) -> list[Tool]:
        """The tools a client declaring no capabilities is listed (`tools_for`)."""
        return await self.tools_for(NO_CAPABILITIES)

    async def tools_for(self, capabilities: Capabilities) -> list[Tool]:
        """The tools listed to a client declaring `capabilities`: the upstream's as it lists them
        to such a client (through that session), and the proxy's own."""
        local = await MCPServer.list_tools(self)
        mine = {tool.name for tool in local}
        session = await self._session_or_mcp_error(capabilities)
        advertised = [self._advertised(tool) for tool in session.tools.values() if tool.name not in mine]
        return advertised + local

    def output_schema_of(self, tool: str) -> dict[str, Any] | None:
        """An upstream tool's output schema as the upstream declares it (refusals must fit it)."""
        upstream = self.upstream.tool(tool)
        if upstream is not None and registered_tool(self, tool) is None:
            return upstream.output_schema
        registered = registered_tool(self, tool)
        return registered.output_schema if registered is not None else None

    def _advertised(self, tool: Tool) -> Tool:
        policy = self.policies.get(tool.name)
        update: dict[str, Any] = {}
        if policy is not None and policy.idempotent:
            # The hint is now a guarantee: advertise it (as DurableServer.add_tool does).
            base = tool.annotations or ToolAnnotations()
            update["annotations"] = base.model_copy(update={"idempotent_hint": True})
        if tool.execution is not None and (policy is None or policy.task_support == "forbidden"):
            # The upstream's own task support is not forwarded: a client must not ask the proxy
            # for a task it does not serve. (Where it serves one, the tasks protocol advertises it.)
            update["execution"] = None
        return tool.model_copy(update=update) if update else tool

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        if registered_tool(self, name) is not None:  # an admin tool of ours
            return await self.calls.plain(MCPServer.call_tool(self, name, arguments, context), name)
        # Through the session of the caller's capabilities: the upstream does what it would for it.
        session = self.upstream.session(_capabilities(context))
        policy = self.policies.get(name)
        if policy is None:  # pass-through, or not listed yet: the upstream is needed either way
            try:
                await self._client(session)  # before any claim: an unreachable upstream journals nothing
            except UpstreamUnavailableError as exc:
                return self.calls.refuse(name, exc)
            policy = self.policies.get(name)  # listed now
            if policy is None:
                return await self._pass_through(session, name, arguments, context)
        try:
            # The upstream validates the arguments; what the journal cannot hold faithfully (NaN,
            # ±Infinity, too deep, too large) is refused here, before any claim, as in serve.
            limits.check_argument_values(name, arguments, self.calls.limits.argument_depth)
            canonical = limits.checked_arguments(name, arguments, self.calls.limits.argument_bytes)
        except DurableError as exc:
            return self.calls.refuse(name, exc)
        return await self._durable_call(session, name, policy, arguments, canonical, context)

    async def _pass_through(
        self, session: UpstreamSession, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None
    ) -> CallToolResult | InputRequiredResult:
        request = _request_context(context)
        with session.router.call(request):
            try:
                return await session.call_tool(
                    name, arguments, _forwarded_meta(request), _progress(context), self.upstream.spec.call_timeout
                )
            except UpstreamTimedOut as exc:  # this call only: the session and the other calls go on
                raise MCPError(code=REQUEST_TIMEOUT, message=f"upstream: {exc}") from exc
            except UpstreamLost as exc:
                raise MCPError(code=INTERNAL_ERROR, message=f"upstream: {exc}") from exc

    async def _durable_call(
        self,
        session: UpstreamSession,
        name: str,
        policy: ToolPolicy,
        arguments: dict[str, Any],
        canonical: bytes,
        context: Context[Any, Any] | None,
    ) -> CallToolResult | InputRequiredResult:
        """A durable call: the journal answers a repeat of a journaled key whether or not the
        upstream is up; a miss needs it, and is refused `upstream_unavailable` before any claim
        when it cannot be reached.

        With no session up, the journal is asked first (a repeat then waits for no connect
        attempt); with one, the upstream is checked first (`ready`) and the journal asked only
        if that fails, so a miss on a healthy upstream costs no read more than before.
        """
        asked = not session.connected
        if asked and await self._journaled(name, policy, arguments, canonical, context):
            return await self._run_durable_call(session, name, policy, arguments, canonical, context)
        try:
            await self._client(session)
            await session.ready()
        except UpstreamUnavailableError as exc:
            if not asked and await self._journaled(name, policy, arguments, canonical, context):
                return await self._run_durable_call(session, name, policy, arguments, canonical, context)
            return self.calls.refuse(name, exc)
        refreshed = self.policies.get(name)  # the upstream may have been reconnected, and relisted
        if refreshed is None:
            return await self._pass_through(session, name, arguments, context)
        return await self._run_durable_call(session, name, refreshed, arguments, canonical, context)

    async def _run_durable_call(
        self,
        session: UpstreamSession,
        name: str,
        policy: ToolPolicy,
        arguments: dict[str, Any],
        canonical: bytes,
        context: Context[Any, Any] | None,
    ) -> CallToolResult | InputRequiredResult:
        request = _request_context(context)
        run = self._forwarder(session, name, policy, arguments, request, context)
        return await self.calls.run(name, policy, arguments, canonical, context, run)

    async def _journaled(
        self,
        name: str,
        policy: ToolPolicy,
        arguments: dict[str, Any],
        canonical: bytes,
        context: Context[Any, Any] | None,
    ) -> bool:
        """Whether the journal holds a final result (completed or failed, not expired) for this
        call's key: a repeat the engine answers without running anything.

        Only a hint for the order of the checks: the engine decides on its own read, and a
        record gone in between makes its run reach for the upstream (refused, released, if it
        is still down). A call without a key, with a bad one, or a journal fault: False, and
        the engine answers those itself.
        """
        record = await self._record_of(name, policy, arguments, canonical, context)
        return record is not None and record.state in (CallState.COMPLETED, CallState.FAILED)

    async def _record_of(
        self,
        name: str,
        policy: ToolPolicy,
        arguments: dict[str, Any],
        canonical: bytes,
        context: Context[Any, Any] | None,
    ) -> CallRecord | None:
        """The unexpired record of this call's key; None without one, for a call without a key
        (or a bad one), and on a journal fault (the engine answers those itself)."""
        try:
            key = keys.resolve_key(policy, name, arguments, caller_meta(context), canonical=canonical)
            if key is None:
                return None
            await self.engine.start()  # (once; a no-op when serving)
            record = await self.journal.get(CallIdentity(self.principal_of(context), name, key))
        except DurableError:
            return None
        return None if record is None or record.is_expired(self.engine.clock()) else record

    def _forwarder(
        self,
        session: UpstreamSession,
        name: str,
        policy: ToolPolicy,
        arguments: dict[str, Any],
        request: Any,
        context: Context[Any, Any] | None,
    ) -> Runner:
        """The engine's `run` of a durable call made in `request`: forwarded upstream through the
        `session` of its client's capabilities with the request's `_meta`, its progress relayed
        and the upstream's requests routed to its client."""
        return self._upstream_run(
            session,
            name,
            policy,
            arguments,
            lambda: _forwarded_meta(request),
            lambda: session.router.call(request),
            context,
        )

    def _task_forwarder(self, name: str, policy: ToolPolicy, arguments: dict[str, Any], meta: dict[str, Any]) -> Runner:
        """The engine's `run` of a task, in the background: forwarded upstream as a plain call with
        `meta` (the creating request's, forwarded), no request context to relay progress to; for a
        tool the upstream serves only as a task, as the upstream's own task (`upstream_tasks`).

        Always through the no-capability session, for the first run and a resume after a restart
        alike: no client waits on the run to answer the upstream's requests, so the upstream is
        shown a client that declares none, and does what it does for one (a request it sends all
        the same gets the SDK client's answer for a capability it lacks, and its log messages
        meanwhile reach no client: `Router.background`)."""
        session = self.upstream.session(NO_CAPABILITIES)
        tool = session.tools.get(name)
        as_task = tool is not None and _declared_task_support(tool) == "required"
        return self._upstream_run(
            session, name, policy, arguments, lambda: dict(meta), session.router.background, None, as_task
        )

    def _upstream_run(
        self,
        session: UpstreamSession,
        name: str,
        policy: ToolPolicy,
        arguments: dict[str, Any],
        meta_of: Callable[[], dict[str, Any]],
        routed: Callable[[], AbstractContextManager[None]],
        context: Context[Any, Any] | None,
        as_task: bool = False,
    ) -> Runner:
        """`as_task`: run as the upstream's own task (a tool it serves only as one)."""

        async def run(call: DurableCall | None) -> ToolOutcome:
            meta = meta_of()
            if call is not None:
                meta[KEY_META] = call.scoped_key  # the key travels downstream
            with routed():
                try:
                    # No read timeout of its own: the engine bounds the run by the policy's
                    # `timeout` and cancels it (the SDK then abandons this one request, telling the
                    # upstream), which leaves the call in doubt and the shared session up.
                    result: CallToolResult | InputRequiredResult
                    if as_task:
                        result = await upstream_tasks.call_tool_as_task(session, name, arguments, meta)
                    else:
                        result = await session.call_tool(name, arguments, meta, _progress(context))
                except UpstreamLost as exc:
                    raise OutcomeUnknownError(str(exc)) from exc
                except MCPError as exc:  # the upstream answered a JSON-RPC error: as a tool raising it
                    return self.calls.protocol_error_outcome(name, policy, exc)
            return self.calls.outcome(name, policy, result)

        return run

    async def _client(self, session: UpstreamSession | None = None) -> Any:
        """`session`'s client (the no-capability session's by default), the policies applied to
        its tools as last listed."""
        session = session or self.upstream.session()
        client = await session.client()
        if self._applied_listing.get(session.capabilities) != session.listings:
            await self.refresh(session.capabilities)  # a new session, or it said they changed: listed again
        return client

    async def _tools_changed(self) -> None:
        """The upstream said its tools changed: list them on every session up and apply the
        policies now, before the clients listening for the change are told."""
        for session in self.upstream.sessions():
            if session.connected:
                try:
                    await self._client(session)
                except UpstreamUnavailableError:
                    pass  # the next session lists them when it connects

    # -- tasks --------------------------------------------------------------------------------------

    async def _submit_task(
        self, name: str, arguments: dict[str, Any], request: ServerRequestContext[Any, Any]
    ) -> CallRecord:
        """Create (or find, for a repeated key) the task of one call of proxied tool `name` (the
        tasks' `TaskSubmitter`, for a tool whose policy has task support).

        Returns at once with the task's record; its run forwards the call upstream in the
        background (`_task_forwarder`), once per key. Refused before any claim as a durable call
        is: arguments the journal cannot hold (`limits`), and an upstream that cannot be reached
        (`upstream_unavailable`) unless the journal answers the key without it (the key's task,
        or its call, exists). Raises the `DurableError`, which the tasks protocol answers as a
        JSON-RPC error (there is no task to carry it).
        """
        context = Context(request_context=request, mcp_server=self)
        limits.check_argument_values(name, arguments, self.calls.limits.argument_depth)
        canonical = limits.checked_arguments(name, arguments, self.calls.limits.argument_bytes)
        policy = await self._task_ready(name, arguments, canonical, context)
        return await self.engine.submit(
            tool=name,
            policy=policy,
            arguments=arguments,
            meta=caller_meta(context),
            run=self._task_forwarder(name, policy, arguments, _forwarded_meta(request)),
            principal=self.principal_of(context),
            canonical=canonical,
        )

    async def _task_ready(
        self, name: str, arguments: dict[str, Any], canonical: bytes, context: Context[Any, Any]
    ) -> ToolPolicy:
        """The tool's task-capable policy once the upstream is known to be reachable, or the
        journal answers the call without it; `UpstreamUnavailableError` otherwise (nothing
        claimed). The same order of checks as `_durable_call`'s."""
        policy = self._task_policy(name)
        session = self.upstream.session()  # where a task's run goes (`_task_forwarder`)
        asked = not session.connected
        if asked and await self._task_answered(name, policy, arguments, canonical, context):
            return policy
        try:
            await self._client(session)
            await session.ready()
        except UpstreamUnavailableError:
            if not asked and await self._task_answered(name, policy, arguments, canonical, context):
                return policy
            raise
        return self._task_policy(name)  # the upstream may have been reconnected, and relisted

    def _task_policy(self, name: str) -> ToolPolicy:
        """The policy of `name` when the proxy serves tasks of it; -32601 when it does not (any
        more: the upstream's tools were listed again since the tasks protocol looked)."""
        policy = self.policies.get(name)
        if policy is None or policy.task_support == "forbidden":
            raise MCPError(code=METHOD_NOT_FOUND, message=f"Tool {name!r} does not support task augmentation")
        return policy

    async def _task_answered(
        self, name: str, policy: ToolPolicy, arguments: dict[str, Any], canonical: bytes, context: Context[Any, Any]
    ) -> bool:
        """Whether the engine answers this task-creating call from the key's record without running
        anything (`decide.submit_decision`): any unexpired record but one released without a result
        (which runs again as a new task). A hint for the order of checks, as `_journaled` is."""
        record = await self._record_of(name, policy, arguments, canonical, context)
        return record is not None and not (record.state is CallState.RELEASED and not record.cancelled)

    async def _resume_task(self, record: CallRecord) -> None:
        """The engine's `task_resumer`: drive a task of a proxied tool on by its in-doubt policy
        (`retry` forwards the call upstream again, with the same scoped key; `refuse` leaves it).

        Needs the upstream: the tools must be listed for the policy, and a run must reach it. An
        upstream that cannot be reached leaves the task in doubt (its status `working` under
        `retry`), for the next read of it to resume; a run that cannot reach it after all leaves
        it in doubt too, never released: the outcome of the run that was cut off is still unknown.
        """
        identity = record.identity
        if identity in self._resuming or record.arguments is None:
            return
        known = self.policies.get(identity.tool)
        if known is not None and in_doubt_refused(record, known):
            return  # refuse, or parked: nothing runs it again (the engine would say the same)
        self._resuming.add(identity)
        try:
            with anyio.move_on_after(self.upstream.spec.connect_timeout):
                await self._supervising.wait()  # at start the engine resumes before the upstream is up
            try:
                await self._client()
                await self.upstream.session().ready()
            except UpstreamUnavailableError as exc:
                logger.info("task %s of tool %r stays in doubt: %s", record.task_id, identity.tool, exc)
                return
            policy = self.policies.get(identity.tool)
            if policy is None:
                return  # the upstream no longer has the tool, or it is passed through: an operator decides
            arguments = orjson.loads(record.arguments)
            forward = self._task_forwarder(identity.tool, policy, arguments, {})

            async def run(call: DurableCall | None) -> ToolOutcome:
                try:
                    return await forward(call)
                except UpstreamUnavailableError as exc:
                    raise OutcomeUnknownError(
                        f"upstream {exc.upstream} could not be reached to resume the call"
                    ) from exc

            await self.engine.resume(identity, policy, run)
        finally:
            self._resuming.discard(identity)

    # -- resources, prompts, completions -----------------------------------------------------------

    async def list_resources(self) -> list[Resource]:
        return await self.resources_for(NO_CAPABILITIES)

    async def resources_for(self, capabilities: Capabilities) -> list[Resource]:
        """The resources listed to a client declaring `capabilities`: the upstream's through that
        session, and the proxy's own."""
        client = await self._client_or_mcp_error(capabilities)
        upstream = await _all_pages(client.list_resources, "resources") if _serves(client, "resources") else []
        return list(upstream) + await MCPServer.list_resources(self)

    async def list_resource_templates(self) -> list[ResourceTemplate]:
        return await self.resource_templates_for(NO_CAPABILITIES)

    async def resource_templates_for(self, capabilities: Capabilities) -> list[ResourceTemplate]:
        """The resource templates listed to a client declaring `capabilities`, as `resources_for`."""
        client = await self._client_or_mcp_error(capabilities)
        upstream = (
            await _all_pages(client.list_resource_templates, "resource_templates")
            if _serves(client, "resources")
            else []
        )
        return list(upstream) + await MCPServer.list_resource_templates(self)

    async def list_prompts(self) -> list[Prompt]:
        return await self.prompts_for(NO_CAPABILITIES)

    async def prompts_for(self, capabilities: Capabilities) -> list[Prompt]:
        """The prompts listed to a client declaring `capabilities`, as `resources_for`."""
        client = await self._client_or_mcp_error(capabilities)
        upstream = await _all_pages(client.list_prompts, "prompts") if _serves(client, "prompts") else []
        return list(upstream) + await MCPServer.list_prompts(self)

    async def get_prompt(
        self, name: str, arguments: dict[str, Any] | None = None, context: Context[Any, Any] | None = None
    ) -> GetPromptResult | InputRequiredResult:
        request = _request_context(context)
        session = self.upstream.session(_capabilities(context))
        client = await self._client_or_mcp_error(session.capabilities)
        with session.router.call(request):
            result: GetPromptResult = await client.session.get_prompt(name, arguments, meta=_forwarded_meta(request))
        return result

    async def _session_or_mcp_error(self, capabilities: Capabilities) -> UpstreamSession:
        session = self.upstream.session(capabilities)
        await self._client_or_mcp_error(capabilities)
        return session

    async def _client_or_mcp_error(self, capabilities: Capabilities = NO_CAPABILITIES) -> Any:
        try:
            return await self._client(self.upstream.session(capabilities))
        except UpstreamUnavailableError as exc:
            raise refusal_error(exc) from exc

    def _install_forwarding(self) -> None:
        lowlevel = lowlevel_server(self)
        local_read = lowlevel.get_request_handler("resources/read")
        assert local_read is not None  # MCPServer serves resources/read; resources.py wrapped it

        async def read(ctx: ServerRequestContext[Any, Any], params: ReadResourceRequestParams) -> Any:
            if str(params.uri).startswith(LOCAL_SCHEME):
                return await local_read.handler(ctx, params)
            session = self.upstream.session(declared_by(ctx.session))
            client = await self._client_or_mcp_error(session.capabilities)
            with session.router.call(ctx):
                result: ReadResourceResult = await client.session.read_resource(
                    str(params.uri), meta=_forwarded_meta(ctx)
                )
            return result

        async def complete(ctx: ServerRequestContext[Any, Any], params: CompleteRequestParams) -> CompleteResult:
            client = await self._client_or_mcp_error(declared_by(ctx.session))
            context = params.context.arguments if params.context is not None else None
            result: CompleteResult = await client.session.complete(
                params.ref, {"name": params.argument.name, "value": params.argument.value}, context
            )
            return result

        async def set_level(ctx: ServerRequestContext[Any, Any], params: SetLevelRequestParams) -> EmptyResult:
            # Shared upstream sessions: the level last set is every session's (sent again on every
            # new one) and each session router's filter on what it forwards.
            try:
                await self.upstream.set_log_level(params.level)
            except (MCPError, UpstreamLost, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                logger.debug("could not set the upstream's log level: %s", exc)  # the proxy still filters
            return EmptyResult()

        lowlevel.add_request_handler("resources/read", ReadResourceRequestParams, read)
        self.subscriptions.install(lowlevel)
        lowlevel.add_request_handler("completion/complete", CompleteRequestParams, complete)
        # Declares the `logging` capability: the upstream's log messages are forwarded.
        lowlevel.add_request_handler("logging/setLevel", SetLevelRequestParams, set_level)
        self._install_listings(lowlevel)

    def _install_listings(self, lowlevel: Any) -> None:
        """`tools/list`, `resources/list`, `resources/templates/list` and `prompts/list` answered
        for the caller's capabilities (`MCPServer` asks its `list_*` methods without the request)."""
        listings: dict[str, tuple[Callable[[Capabilities], Awaitable[Any]], Callable[[Any], Any]]] = {
            "tools/list": (self.tools_for, lambda items: ListToolsResult(tools=items)),
            "resources/list": (self.resources_for, lambda items: ListResourcesResult(resources=items)),
            "resources/templates/list": (
                self.resource_templates_for,
                lambda items: ListResourceTemplatesResult(resource_templates=items),
            ),
            "prompts/list": (self.prompts_for, lambda items: ListPromptsResult(prompts=items)),
        }
        for method, (listing, result) in listings.items():
            entry = lowlevel.get_request_handler(method)
            assert entry is not None  # MCPServer serves every listing

            async def handler(
                ctx: ServerRequestContext[Any, Any],
                params: Any,
                listing: Callable[[Capabilities], Awaitable[Any]] = listing,
                result: Callable[[Any], Any] = result,
            ) -> Any:
                return result(await listing(declared_by(ctx.session)))

            lowlevel.add_request_handler(method, entry.params_type, handler)


#: What an upstream's `isError` result is for a proxied tool unless its policy says otherwise.
PROXY_TOOL_ERRORS: ErrorHandling = "release"


def _no_encoder(name: str) -> Encoder | None:
    """A proxied tool's reconcile hook finds nothing to encode: an upstream has no hooks here."""
    return None


def _tool_errors_chosen(policies: Policies) -> frozenset[str]:
    """The tools whose `tool_errors` the policies chose themselves (kept as given)."""
    return frozenset(name for name in policies.tools if policies.chose(name, "tool_errors"))


def _declared_task_support(tool: Tool) -> TaskSupport | None:
    """The upstream's own `execution.taskSupport` for `tool` (None: it declared none)."""
    return tool.execution.task_support if tool.execution is not None else None


def _annotations(tool: Tool) -> dict[str, Any] | None:
    if tool.annotations is None:
        return None
    dumped: dict[str, Any] = tool.annotations.model_dump(by_alias=True, exclude_none=True)
    return dumped


def _serves(client: Any, capability: str) -> bool:
    caps = client.server_capabilities
    return getattr(caps, capability, None) is not None


async def _all_pages(fetch: Any, attribute: str) -> Iterable[Any]:
    items: list[Any] = []
    cursor: str | None = None
    while True:
        page = await fetch(cursor=cursor)
        items.extend(getattr(page, attribute))
        cursor = page.next_cursor
        if not cursor:
            return items


def _capabilities(context: Context[Any, Any] | None) -> Capabilities:
    """The capabilities of the client making the request of `context` (none without one)."""
    request = _request_context(context)
    return declared_by(request.session) if request is not None else NO_CAPABILITIES


def _request_context(context: Context[Any, Any] | None) -> Any:
    if context is None:
        return None
    try:
        return context.request_context
    except ValueError:
        return None


def _forwarded_meta(request: Any) -> dict[str, Any]:
    """The downstream request's `_meta`, minus what belongs to the downstream connection (the
    progress token, the 2026-07-28 envelope `io.modelcontextprotocol/…`, which the upstream's own
    session speaks for itself) and the caller's raw key (the upstream gets the scoped key)."""
    meta = getattr(request, "meta", None) if request is not None else None
    if not meta:
        return {}
    items = meta.items() if isinstance(meta, dict) else meta.model_dump(by_alias=True, exclude_none=True).items()
    return {
        name: value
        for name, value in items
        if name not in ("progressToken", "progress_token", KEY_META) and not name.startswith(_RESERVED_META)
    }


def _progress(context: Context[Any, Any] | None) -> Any:
    """A progress callback relaying the upstream's progress to the caller.

    Always given: whether the caller asked for progress is not visible on every transport (the
    in-process dispatcher passes its callback beside the request, not as a `progressToken`), and
    `report_progress` is a no-op for a caller that did not ask.
    """
    if context is None:
        return None

    async def relay(progress: float, total: float | None, message: str | None) -> None:
        try:
            await context.report_progress(progress, total, message)
        except Exception:  # noqa: BLE001 - a progress note must never fail the call
            logger.debug("could not relay progress", exc_info=True)

    return relay


__all__ = ["DurableError", "ProxyServer"]
