"""`DurableServer`: an `MCPServer` whose durable tools run once per key.

Tools registered with `durable=` (a `ToolPolicy`, or `True` for the defaults) are wrapped: every
`tools/call` of one goes through the engine, which claims the key in the journal, runs the tool
once, persists its result and replays it for every repeat. Other tools run untouched.

The seam is `MCPServer.call_tool`, which every transport and both protocol eras reach through
`_handle_call_tool`. We override it rather than use `Extension.intercept_tool_call` because
here a tool's deliberate `ToolError` (a result to persist) and an unexpected exception (to
release, so a retry runs again) are still distinct exceptions; in an interceptor both have
already become identical `isError` results.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypedDict, TypeVar, Unpack, cast

import anyio
import orjson
from mcp import MCPError
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import ProviderTokenVerifier, TokenVerifier
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.tools import Tool
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    InputRequiredResult,
    SubscribeRequestParams,
    SubscriptionsListenRequestParams,
    TextContent,
    ToolAnnotations,
    UnsubscribeRequestParams,
)
from pydantic import ValidationError

from .. import config, keys, limits
from ..engine import LOCAL_PRINCIPAL, Encoder, Engine, Runner, ToolOutcome
from ..errors import ClientRequestWithoutKeyError, ConfigError, DurableError, JournalError
from ..journal import CallRecord, Journal, create_journal, default_journal_url, display_url
from ..operations.recovery import BackgroundRecovery, ReconcilePass
from ..operations.retention import BackgroundRetention, RetentionSchedule
from ..operations.schedule import check_interval
from ..operations.telemetry import ObservedCall, Telemetry
from ..policy import ToolPolicy, as_policy
from ..steps import DurableCall
from . import prevalidated
from .admin import admin_tools
from .auth import token_auth_kwargs
from .lookup import journal_lookup_tool
from .notifications import JournalNotifier
from .ports import ScopedSubscriptionBus, ToolSpec
from .prevalidated import PreparedTool
from .resources import (
    JSON,
    JournalResources,
    answering_durable_errors,
    install_read_context,
    journal_resources,
    maintenance_body,
)
from .results import (
    META_REPLAYED,
    OutputSchemas,
    answer,
    asks_for_input,
    dump_result,
    protocol_error_result,
    refusal,
    replay_answer,
)
from .sdk_internals import (
    bare_tools_call_handler,
    lowlevel_server,
    registered_tool,
    request_meta,
    subscription_bus,
)
from .tasks import TaskProtocol, TasksExtension, skip_idle_interceptor

#: Names this replica among several sharing one journal (its lifecycle process is server/NAME/REPLICA).
ENV_INSTANCE = config.INSTANCE

#: Seconds between background reconcile passes (`reconcile_interval`); the first runs at start.
DEFAULT_RECONCILE_INTERVAL = 60.0
#: The retention a server runs by itself unless told otherwise (`retention_schedule`).
DEFAULT_RETENTION_SCHEDULE = RetentionSchedule()

_F = TypeVar("_F", bound=Callable[..., Any])


class ToolOptions(TypedDict, total=False):
    """The SDK's options of a tool besides its name (`MCPServer.add_tool`'s parameters), as the
    decorator form takes them: by keyword, so the list is written once, here."""

    title: str | None
    description: str | None
    annotations: ToolAnnotations | None
    icons: Sequence[Any] | None
    meta: dict[str, Any] | None
    structured_output: bool | None


logger = logging.getLogger(__name__)


def default_principal(context: Context[Any, Any] | None) -> str:
    """The caller's principal: the authenticated token's identity on HTTP, else `local`."""
    token = get_access_token()
    if token is None:
        return LOCAL_PRINCIPAL
    return keys.token_principal(token.client_id, token.subject, (token.claims or {}).get("iss"))


class DurableServer(MCPServer[Any]):
    """An `MCPServer` with a journal; tools registered `durable=` are deduplicated by key.

    `journal` is a URL (`file://…`, `sqlite:///…`, `postgresql://…`, `memory://`), a `Journal`,
    or None for the embedded default `file://.mcp-durable/journal`. `principal` maps a request to
    the identity records are scoped by. `clock` is injected into the engine for tests. `tokens`
    (`{bearer_token: principal}`) turns on bearer auth on HTTP. `trust_env` (like httpx's): True
    reads what is not passed from the environment (`journal` from `$MCP_DURABLE_JOURNAL`,
    `tokens` from `$MCP_DURABLE_TOKENS`, `admin_principals` from `$MCP_DURABLE_ADMINS`, the
    replica's name from `$MCP_DURABLE_INSTANCE`); False never does; None (the default) follows
    the process default, off unless the command line (`mcp-durable serve`, `proxy`) or the
    application turned it on (`mcp_durable.config.use_environment()`).
    `max_argument_bytes` (1 MiB) / `max_result_bytes` (16 MiB) bound what a durable call journals
    (`mcp_durable.limits`); `None` lifts a limit. `max_argument_depth` (64) bounds how deep a
    durable call's arguments nest (`arguments_too_deep`); non-finite numbers in them are always
    refused (`non_finite_argument`). `telemetry` (a `Telemetry`, or True for one on the global
    OpenTelemetry providers) adds durable attributes, child spans and metrics to every durable
    call (docs/telemetry.md); None emits nothing. `lookup_tool=True` adds
    `journal_lookup(tool, key)`, a read tool any caller may use on its own records
    (server/lookup.py). `reconcile_interval` (60 s; None: off) reconciles in-doubt calls of
    `reconcile` tools in the background (recovery.py); `retention_schedule` (None: off) purges
    expired records, their steps and old lifecycle entries, and compacts the file journal,
    every `interval` (retention.py).
    """

    def __init__(
        self,
        name: str | None = None,
        *args: Any,
        journal: str | Journal | None = None,
        principal: Callable[[Context[Any, Any] | None], str] = default_principal,
        clock: Callable[[], float] | None = None,
        instance_id: str | None = None,
        lifespan: Callable[[MCPServer[Any]], AbstractAsyncContextManager[Any]] | None = None,
        tokens: Mapping[str, str] | None = None,
        admin_principals: Collection[str] = (),
        max_argument_bytes: int | None = limits.DEFAULT_MAX_ARGUMENT_BYTES,
        max_result_bytes: int | None = limits.DEFAULT_MAX_RESULT_BYTES,
        max_argument_depth: int | None = limits.DEFAULT_MAX_ARGUMENT_DEPTH,
        telemetry: Telemetry | bool | None = None,
        lookup_tool: bool = False,
        reconcile_interval: float | None = DEFAULT_RECONCILE_INTERVAL,
        retention_schedule: RetentionSchedule | None = DEFAULT_RETENTION_SCHEDULE,
        trust_env: bool | None = None,
        **kwargs: Any,
    ) -> None:
        # Settings not passed come from the environment only where it is trusted (config.py).
        from_env = config.trusts_environment(trust_env)
        if tokens is None and "token_verifier" not in kwargs and "auth_server_provider" not in kwargs:
            tokens = config.tokens(from_env)
        if tokens:
            # Bearer tokens mapped to principals: requests without a valid token are refused (401).
            kwargs.update(token_auth_kwargs(tokens))
        self._user_lifespan = lifespan
        #: Connections inside `_durable_lifespan` now; the background jobs run while any is.
        self._lifespan_users = 0
        self._background_jobs: asyncio.Task[None] | None = None
        if len(args) < 6 and "version" not in kwargs:  # version is MCPServer's 7th parameter
            # serverInfo.version: the server's own when given, else this package's (not "").
            from ..version import __version__

            kwargs["version"] = __version__
        # MCP tasks (server/tasks.py): the 2026-07-28 extension's methods and tools/call interceptor.
        tasks_extension = TasksExtension()
        extensions = kwargs["extensions"] = [*(kwargs.get("extensions") or ()), tasks_extension]
        super().__init__(name, *args, lifespan=self._durable_lifespan, **kwargs)
        #: What verifies bearer tokens on HTTP (None: no auth), as the SDK builds it from the same
        #: arguments; the console verifies its sign-in tokens with it.
        self.token_verifier: TokenVerifier | None = kwargs.get("token_verifier")
        if self.token_verifier is None and kwargs.get("auth_server_provider") is not None:
            self.token_verifier = ProviderTokenVerifier(kwargs["auth_server_provider"])
        if journal is None or isinstance(journal, str):
            store = create_journal(journal or default_journal_url(from_env))
        else:
            store = journal
        # The lifecycle is journaled per replica when replicas are named ($MCP_DURABLE_INSTANCE):
        # on a shared journal one replica's `running` must not read as another's unclean stop.
        replica = config.instance(from_env)
        process_id = f"server/{self.name}" + (f"/{replica}" if replica else "")
        engine_kwargs: dict[str, Any] = {"instance_id": instance_id, "process_id": process_id}
        if clock is not None:
            engine_kwargs["clock"] = clock
        self.engine = Engine(store, **engine_kwargs)
        # A repeat's answer is made once per record the engine keeps for repeats (its replay cache).
        self.engine.render_replay = replay_answer
        self.principal_of = principal
        # Size limits of what a durable call journals (see mcp_durable/limits.py; None = no limit).
        self.max_argument_bytes = limits.check_limit("max_argument_bytes", max_argument_bytes)
        self.max_result_bytes = limits.check_limit("max_result_bytes", max_result_bytes)
        self.max_argument_depth = limits.check_limit("max_argument_depth", max_argument_depth)
        self.policies: dict[str, ToolPolicy] = {}
        #: Compiled output schemas: a refusal is `structuredContent` only where it fits (results.py).
        self.output_schemas = OutputSchemas()
        # `admin_principals` (or `$MCP_DURABLE_ADMINS`, trusted) see every record and may operate.
        self.admin_principals: frozenset[str] = frozenset(admin_principals) or config.admins(from_env)
        self.telemetry: Telemetry | None = Telemetry() if telemetry is True else (telemetry or None)
        if self.telemetry is not None:
            self.telemetry.attach(self.engine)
        # Everything the helper modules define is registered here, in this order (the change
        # notifier's engine listener runs before the tasks' one); each helper is given only the
        # narrow face of this server it uses (server/ports.py), never the server itself.
        self.journal_views = self._register_journal_resources()
        self.journal_notifier = self._register_notifications()
        if self.admin_principals:
            self._register_tools(admin_tools(self))
        # Tasks: served in both generations; in-doubt tasks are resumed at start.
        self.tasks = TaskProtocol(self, self._submit_requested_task)
        tasks_extension.protocol = self.tasks
        self.middleware.append(self.tasks.middleware)
        # The SDK wraps every `tools/call` in its extensions' interceptors; ours acts only on calls
        # that may become tasks, so the others skip the chain (server/tasks.py).
        composed = lowlevel_server(self).get_request_handler("tools/call")
        assert composed is not None  # MCPServer registers it, wrapped in the interceptors
        lowlevel_server(self).add_request_handler(
            "tools/call",
            composed.params_type,
            skip_idle_interceptor(extensions, composed.handler, bare_tools_call_handler(self), self),
        )
        self.engine.listeners.append(self.tasks.on_change)
        self.engine.task_resumer = self._resume_task
        self.engine.task_policy = self.policies.get
        if lookup_tool:
            self._register_tools([journal_lookup_tool(self)])
        # In-doubt calls of `reconcile` tools are reconciled at start and every interval (recovery.py).
        self.recovery: BackgroundRecovery | None = None
        if check_interval("reconcile_interval", reconcile_interval) is not None:
            assert reconcile_interval is not None
            self.recovery = BackgroundRecovery(
                self.engine,
                self.policies,
                self.result_encoder,
                reconcile_interval,
                after_pass=self._after_recovery_pass,
            )
        # Expired records, their steps and old lifecycle entries purged on a schedule (retention.py).
        self.retention: BackgroundRetention | None = None
        if retention_schedule is not None:
            check_interval("retention_schedule.interval", retention_schedule.interval)
            self.retention = BackgroundRetention(self.engine, retention_schedule)

    @property
    def journal(self) -> Journal:
        return self.engine.journal

    def request_principal(self, request: ServerRequestContext[Any, Any] | None) -> str:
        """The principal of a low-level request (None: no request being served), by `principal_of`."""
        return self.principal_of(None if request is None else Context(request_context=request, mcp_server=self))

    def is_admin(self, principal: str) -> bool:
        """Whether `principal` is one of the `admin_principals`: sees every record, may operate."""
        return principal in self.admin_principals

    # -- what the helper modules define, registered (server/ports.py is the face they see) ---------

    def _register_journal_resources(self) -> JournalResources:
        """The `journal://…` resources (server/resources.py), every read scoped by principal."""
        views = JournalResources(self, lambda: maintenance_body(self.retention, self.recovery))
        for resource in journal_resources(views):
            register = self.resource(
                resource.uri,
                name=resource.name,
                mime_type=JSON,
                description=resource.read.__doc__,
                security=resource.security,
            )
            register(answering_durable_errors(resource.read))
        install_read_context(lowlevel_server(self))
        return views

    def _register_notifications(self) -> JournalNotifier:
        """Record changes announced in both protocol eras, scoped by principal (server/notifications.py)."""
        notifier = JournalNotifier(self, subscription_bus(self))
        self.engine.listeners.append(notifier.on_change)
        lowlevel = lowlevel_server(self)
        lowlevel.add_request_handler("resources/subscribe", SubscribeRequestParams, notifier.subscribe)
        lowlevel.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, notifier.unsubscribe)
        if lowlevel.get_request_handler("subscriptions/listen") is not None:  # None: `subscriptions=False`
            lowlevel.add_request_handler(
                "subscriptions/listen", SubscriptionsListenRequestParams, notifier.listen_handler()
            )
        bus = subscription_bus(self)
        if isinstance(bus, ScopedSubscriptionBus):  # e.g. PgSubscriptionBus: across replicas
            notifier.forward_across(bus)
        return notifier

    def _register_tools(self, tools: Sequence[ToolSpec]) -> None:
        for tool in tools:
            self.add_tool(tool.fn, name=tool.name, annotations=tool.annotations)

    def use_journal(self, journal: str | Journal) -> None:
        """Serve on `journal` (a URL or a `Journal`) instead of the one given at construction.

        For `mcp-durable serve --journal URL`, whose target module may have built its server with
        a journal of its own: the engine (calls, leases, lifecycle) then uses this one only. Only
        before the server starts; raises `ConfigError` after.
        """
        self.engine.use_journal(create_journal(journal) if isinstance(journal, str) else journal)

    @asynccontextmanager
    async def _durable_lifespan(self, app: MCPServer[Any]) -> AsyncIterator[Any]:
        # Entered once per stdio/in-memory connection and once by the HTTP session manager, each
        # in its own task and in any order: the journal, telemetry and the background jobs run
        # from the first entry until the last exit, whichever connections those are.
        first = self._lifespan_users == 0
        self._lifespan_users += 1  # counted before the first await: a concurrent entry is not first
        try:
            started = await self._start_engine()
            if first:
                if started and self.telemetry is not None:
                    await self.telemetry.start(self.journal)
                self._start_background_jobs()
            if self._user_lifespan is None:
                yield {}
            else:
                async with self._user_lifespan(app) as state:
                    yield state
        finally:
            self._lifespan_users -= 1
            if self._lifespan_users == 0:
                await self._stop_background_jobs()
                if self.telemetry is not None:
                    self.telemetry.stop()
                try:
                    await self.engine.aclose()
                except JournalError as exc:  # e.g. a full disk: the next boot sees an unclean stop
                    logger.warning(
                        "journal %s: the stop could not be journaled: %s",
                        display_url(self.journal.url),
                        display_url(str(exc)),
                    )

    async def _start_engine(self) -> bool:
        """Start the engine (opening the journal once); False if the journal is unavailable.

        The server serves anyway (full disk, read-only directory, locked database): every durable
        call retries the start and is refused with `journal_unavailable` until it succeeds, so
        the fault clears without a restart.
        """
        try:
            await self.engine.start()
        except JournalError as exc:
            logger.warning("journal %s unavailable at start: %s", display_url(self.journal.url), display_url(str(exc)))
            return False
        return True

    def _start_background_jobs(self) -> None:
        """Run recovery and retention (those configured) in the background, until
        `_stop_background_jobs`.

        In a task of their own, not in a task group of the connection that started them: anyio
        ties a task group to the task that entered it, and that connection may well leave
        before the others (in-memory and stdio connections each enter the lifespan in their own
        task), while the jobs must run as long as any connection is served.
        """
        jobs = [job.run_forever for job in (self.recovery, self.retention) if job is not None]
        if not jobs or self._background_jobs is not None:
            return

        async def run_jobs() -> None:
            async with anyio.create_task_group() as group:
                for job in jobs:
                    group.start_soon(job)

        self._background_jobs = asyncio.get_running_loop().create_task(run_jobs(), name=f"{self.name} background")

    async def _stop_background_jobs(self) -> None:
        """Cancel the background jobs, a pass in flight included, and wait until they have stopped."""
        running, self._background_jobs = self._background_jobs, None
        if running is None:
            return
        running.cancel()
        with anyio.CancelScope(shield=True):  # the last connection leaving may itself be cancelled
            await asyncio.gather(running, return_exceptions=True)

    async def aclose(self) -> None:
        """Close the journal (for servers used without a transport, e.g. `call_tool` in scripts)."""
        await self.engine.aclose()

    # -- registration -----------------------------------------------------------------------------

    def add_tool(
        self,
        fn: Callable[..., Any],
        name: str | None = None,
        title: str | None = None,
        description: str | None = None,
        annotations: ToolAnnotations | None = None,
        icons: Sequence[Any] | None = None,
        meta: dict[str, Any] | None = None,
        structured_output: bool | None = None,
        *,
        durable: ToolPolicy | bool | None = None,
    ) -> None:
        """Register a tool; with `durable=` it runs once per key (see `ToolPolicy`).

        Raises `ConfigError` for a policy the tool cannot run under (nothing is registered then)."""
        policy = as_policy(durable)
        if policy is not None:
            _check_interactive_tasks(name or fn.__name__, policy)
        if policy is not None and policy.advertised_idempotent:
            # The hint is now a guarantee: advertise it.
            base = annotations or ToolAnnotations()
            annotations = base.model_copy(update={"idempotent_hint": True})
        super().add_tool(
            fn,
            name=name,
            title=title,
            description=description,
            annotations=annotations,
            icons=list(icons) if icons is not None else None,
            meta=meta,
            structured_output=structured_output,
        )
        tool_name = name or fn.__name__
        if policy is not None:
            try:
                _check_fingerprint_names(tool_name, policy, registered_tool(self, tool_name))
            except ConfigError:
                self.remove_tool(tool_name)  # never left registered without its durability
                raise
            _warn_if_interactive_undeclared(tool_name, policy, fn)
            self.policies[tool_name] = policy
            tool = registered_tool(self, tool_name)
            if tool is not None:
                prevalidated.install(tool)  # the face validates; the SDK need not again
                self._prepared[tool_name] = PreparedTool(tool, policy, _encoder(tool))
        else:
            self.policies.pop(tool_name, None)
            self._prepared.pop(tool_name, None)

    @functools.cached_property
    def _prepared(self) -> dict[str, PreparedTool]:
        """Each durable tool's per-call work done once (`prevalidated.PreparedTool`), by name."""
        return {}

    def _prepared_tool(self, name: str, tool: Tool, policy: ToolPolicy) -> PreparedTool:
        prepared = self._prepared.get(name)
        if prepared is None or prepared.tool is not tool or prepared.policy is not policy:
            # Registered behind our back (the SDK's own registration, a policy swapped in): anew.
            prepared = self._prepared[name] = PreparedTool(tool, policy, _encoder(tool))
        return prepared

    def tool(  # type: ignore[override]  # the SDK's options by keyword only (ToolOptions)
        self, name: str | None = None, *, durable: ToolPolicy | bool | None = None, **options: Unpack[ToolOptions]
    ) -> Callable[[_F], _F]:
        """Decorator form of `add_tool`: `@server.tool(durable=ToolPolicy(key_fields=("order_id",)))`.

        Unlike `MCPServer.tool`, the options after `name` are keyword-only (`ToolOptions`)."""
        if callable(name):
            raise TypeError("use @server.tool() (with parentheses), not @server.tool")

        def decorator(fn: _F) -> _F:
            self.add_tool(fn, name, durable=durable, **options)
            return fn

        return decorator

    # -- the call ---------------------------------------------------------------------------------

    def refuse(self, tool: str, error: DurableError, key: str | None = None, text: str | None = None) -> CallToolResult:
        """`error` as the refusal result of a call of `tool` (see `results.refusal`), valid against
        the tool's output schema."""
        schema = self.output_schema_of(tool)
        return refusal(error, key, fits=lambda body: self.output_schemas.accepts(tool, schema, body), text=text)

    def output_schema_of(self, tool: str) -> dict[str, Any] | None:
        """The output schema `tool` declares to clients (None: none, or no such tool)."""
        registered = registered_tool(self, tool)
        return registered.output_schema if registered is not None else None

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        policy = self.policies.get(name)
        tool = registered_tool(self, name)
        if policy is None or tool is None:
            try:
                return await super().call_tool(name, arguments, context)
            except ToolError as exc:
                # A tool of ours (the admin tools) refusing with a DurableError: the same
                # machine-readable refusal as a durable call's.
                if isinstance(exc.__cause__, DurableError):
                    return self.refuse(name, exc.__cause__)
                raise
        prepared = self._prepared_tool(name, tool, policy)
        memo_key: bytes | None = None
        known: prevalidated.Validated | None = None
        model: Any = None
        try:
            # What JSON cannot journal is refused before validation (a too-deep value fails
            # obscurely inside it); a request seen before as a replay is not validated again.
            if limits.check_argument_values(name, arguments, self.max_argument_depth):
                memo_key = prepared.memo_key(arguments)
                known = prepared.recall(memo_key) if memo_key is not None else None
            if known is None:
                model, validated, canonical = self._validated(tool, name, arguments, checked=True)
                fingerprint = keys.policy_fingerprint(policy, validated, canonical=canonical)
            else:
                validated, canonical, fingerprint = known
                limits.check_arguments_size(name, canonical, self.max_argument_bytes)
        except ValidationError:
            return await super().call_tool(name, arguments, context)  # the SDK's own error result
        except DurableError as exc:
            return self.refuse(name, exc)  # nothing claimed: a corrected retry with the same key runs
        run = self._runner(name, arguments, context, policy, model, prepared)
        result = await self.run_durable(
            name, policy, validated, canonical, context, run, prepared.encode, fingerprint=fingerprint
        )
        if memo_key is not None and known is None and result.meta and result.meta.get(META_REPLAYED) is True:
            # Remembered once a request is repeated (a retry): first calls do not fill the memo.
            prepared.remember(memo_key, (validated, canonical, fingerprint))
        return result

    def _validated(
        self, tool: Tool, name: str, arguments: dict[str, Any], *, checked: bool = False
    ) -> tuple[Any, dict[str, Any], bytes]:
        """The arguments' validated model, its JSON form and that form's canonical JSON.

        Validated first: a call with bad arguments is refused before any claim, so a corrected
        retry with the same key still runs (validation errors are not saved). Raises
        `ValidationError`, or a `DurableError`: `non_finite_argument`, `arguments_too_deep`,
        `too_large`, `not_serialisable`. `checked`: the raw `arguments` passed
        `limits.check_argument_values` already.
        """
        # What JSON cannot journal is refused before validation (a too-deep value fails
        # obscurely inside it) and checked again on what validation made of the arguments
        # (a string `"nan"` read as a float): the SDK dumps NaN and ±Infinity as `null`.
        if not checked:
            limits.check_argument_values(name, arguments, self.max_argument_depth)
        model = tool.fn_metadata.arg_model.model_validate(tool.fn_metadata.pre_parse_json(arguments))
        limits.check_argument_values(name, model, None)
        validated: dict[str, Any] = model.model_dump(mode="json", by_alias=True)
        return model, validated, limits.checked_arguments(name, validated, self.max_argument_bytes)

    def _runner(
        self,
        name: str,
        arguments: dict[str, Any],
        context: Context[Any, Any] | None,
        policy: ToolPolicy,
        model: Any = None,
        prepared: PreparedTool | None = None,
    ) -> Runner:
        """The engine's `run` for one call of tool `name`: runs it and encodes what it produced.

        `model` is the face's validation of `arguments` (`_validated`): the tool gets its values
        instead of the SDK validating again (`prevalidated`), called directly when `prepared`
        allows. Without it (a task resumed from the journal, a request whose validation was
        remembered) the SDK validates as usual.
        """

        # Only a tool that takes the context (or parameters the SDK resolves from the client) can
        # send its client a request; any tool can answer `input_required` (checked after its run).
        registered = prepared.tool if prepared is not None else registered_tool(self, name)
        can_ask = registered is None or registered.context_kwarg is not None or bool(registered.resolved_params)

        async def run(call: DurableCall | None) -> ToolOutcome:
            payload: bytes | None = None
            token = None
            from_exception = False
            # A call journaled under a key its caller did not give must not ask its client (see
            # `_without_client_requests`): another session's call would be answered from it.
            guarded = call is not None and _asking_refused(policy, arguments, context)
            called = _without_client_requests(self, name, context) if guarded and can_ask else context
            try:
                if model is not None and prepared is not None and prepared.direct:
                    called_with = called if called is not None else self._bare_context()
                    result, payload = await prepared.run(prepared.one_level(model), called_with)
                else:
                    # What the SDK hands the function (`prevalidated`); made only when the tool runs.
                    token = (
                        None if model is None else prevalidated.validated_as(arguments, model.model_dump_one_level())
                    )
                    result = await MCPServer.call_tool(self, name, arguments, called)
            except UnexpectedToolError as exc:
                if policy.exceptions != "persist" or isinstance(exc.__cause__, ClientRequestWithoutKeyError):
                    raise  # (a refused request to the client is released: never kept, whatever the policy)
                result = CallToolResult(content=[TextContent(type="text", text=str(exc))], is_error=True)
                from_exception = True
            except ToolError as exc:
                result = CallToolResult(content=[TextContent(type="text", text=str(exc))], is_error=True)
            except MCPError as exc:  # passed through by the SDK: a JSON-RPC error, not a result
                return self.protocol_error_outcome(name, policy, exc)
            finally:
                if token is not None:
                    prevalidated.done(token)
            if guarded and isinstance(result, InputRequiredResult):
                raise ClientRequestWithoutKeyError(name)  # 2026-07-28's way of asking the client
            return self.tool_outcome(name, policy, result, payload, from_exception=from_exception)

        return run

    def _bare_context(self) -> Context[Any, Any]:
        """The context `MCPServer.call_tool` makes for a call without one (a task run in the background)."""
        return Context(mcp_server=self, subscriptions=subscription_bus(self))

    def result_encoder(self, name: str) -> Encoder | None:
        """How a value a reconcile hook found for tool `name` becomes its stored result (None: not a tool here)."""
        tool = registered_tool(self, name)
        return None if tool is None else _encoder(tool)

    async def _after_recovery_pass(self, report: ReconcilePass) -> None:
        if self.telemetry is not None:
            await self.telemetry.refresh(self.journal)  # in-doubt calls other replicas marked, too

    def protocol_error_outcome(self, name: str, policy: ToolPolicy, error: MCPError) -> ToolOutcome:
        """What a run that ended in a JSON-RPC error (`MCPError`: raised by the tool, or answered by
        the proxy's upstream) produced, by `policy.exceptions`, like any other exception:

        - `"persist"`: the error as an `isError` result (`results.protocol_error_result`),
          journaled and replayed to every repeat of the key;
        - `"release"`: `error` is raised again; the engine releases the claim (a retry runs again)
          and the caller gets the JSON-RPC error as it was raised.

        Under either policy an error that asks the client to act and call again (URL elicitation
        required) is an interim answer: released, never kept, and raised to the caller by
        `run_durable` (a replay of it would stop the retry it asks for).
        """
        if asks_for_input(error):
            return ToolOutcome(error, b"", is_error=True, final=False)
        if policy.exceptions != "persist":
            raise error
        return self.tool_outcome(name, policy, protocol_error_result(error), from_exception=True)

    def tool_outcome(
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
        over `max_result_bytes` raises `LimitExceeded` (the engine releases the claim), or under
        `exceptions="persist"` becomes a persisted error result.
        """
        if isinstance(result, InputRequiredResult):
            return ToolOutcome(result, b"", is_error=False, final=False)
        final = result  # narrowed to CallToolResult, for the closure
        made = payload
        try:
            payload = limits.result_payload(
                name, lambda: made if made is not None else dump_result(final), self.max_result_bytes
            )
        except limits.LimitExceeded as exc:
            if policy.exceptions != "persist":
                raise  # the engine releases the claim; answered in run_durable
            result = self.refuse(name, exc, text=limits.outcome_text(exc, released=False))
            payload = dump_result(result)
            from_exception = True
        return ToolOutcome(result, payload, is_error=bool(result.is_error), from_exception=from_exception)

    async def run_durable(
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
        """One durable call through the engine, answered as MCP: the path every durable tool takes.

        `arguments` are the validated arguments (`canonical` their canonical JSON, size-checked;
        `fingerprint` the call's under `policy`, when known);
        `run` produces the tool's `ToolOutcome` (see `tool_outcome`). The key comes from the
        request's `_meta` or the policy, the principal from `principal_of(context)`. Refusals
        (`DurableError`) become `isError` results; a replay carries the replay `_meta`. Used by
        `call_tool` here and by the proxy (mcp_durable/proxy/), whose `run` forwards upstream.
        """
        principal = self.principal_of(context)
        if self.telemetry is None:
            return await self._run_durable(
                name, policy, arguments, canonical, context, run, encode, principal, None, fingerprint
            )
        with self.telemetry.call(name, principal) as observed:
            return await self._run_durable(
                name, policy, arguments, canonical, context, run, encode, principal, observed, fingerprint
            )

    async def _run_durable(
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

    # -- tasks (server/tasks.py serves the protocol; these run them) -------------------------------

    async def submit_task(self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None) -> CallRecord:
        """Create (or find, for a repeated key) the task for one call of durable tool `name`.

        Returns at once with the task's record; the tool runs in the background, outside the
        request (it gets no request context), once per key. Raises `ValidationError`,
        `limits.LimitExceeded` (bad arguments) or a `DurableError` (the call is refused).
        """
        policy = self.policies[name]
        tool = registered_tool(self, name)
        assert tool is not None
        model, validated, canonical = self._validated(tool, name, arguments)
        return await self.engine.submit(
            tool=name,
            policy=policy,
            arguments=validated,
            meta=caller_meta(context),
            run=self._runner(name, arguments, None, policy, model),
            encode=_encoder(tool),
            principal=self.principal_of(context),
            canonical=canonical,
        )

    async def _submit_requested_task(
        self, name: str, arguments: dict[str, Any], request: ServerRequestContext[Any, Any]
    ) -> CallRecord:
        """`submit_task` for the low-level request being served (the tasks' `TaskSubmitter`)."""
        return await self.submit_task(name, arguments, Context(request_context=request, mcp_server=self))

    async def _resume_task(self, record: CallRecord) -> None:
        """The engine's `task_resumer`: drive an in-doubt task on by its tool's policy."""
        name = record.identity.tool
        policy = self.policies.get(name)
        tool = registered_tool(self, name)
        if policy is None or tool is None or record.arguments is None:
            return  # the tool is gone: the task stays in doubt for an operator
        arguments = orjson.loads(record.arguments)
        await self.engine.resume(record.identity, policy, self._runner(name, arguments, None, policy), _encoder(tool))


def _encoder(tool: Tool) -> Encoder:
    """The engine's `encode` for a reconcile hook's found value: the tool's own result conversion."""

    def encode(value: Any) -> ToolOutcome:
        result = tool.fn_metadata.convert_result(value)
        assert isinstance(result, CallToolResult)
        return ToolOutcome(result, dump_result(result), is_error=bool(result.is_error))

    return encode


def _check_fingerprint_names(name: str, policy: ToolPolicy, tool: Any) -> None:
    """`ConfigError` unless every name in `fingerprint_fields` / `fingerprint_exclude` is an argument
    of the tool (a typo would silently fingerprint nothing, or everything)."""
    named = (policy.fingerprint_fields or ()) + policy.fingerprint_exclude
    if not named or tool is None:
        return
    fields = tool.fn_metadata.arg_model.model_fields
    known = set(fields) | {field.alias for field in fields.values() if field.alias}
    unknown = [argument for argument in named if argument not in known]
    if unknown:
        raise ConfigError(
            f"tool {name!r} has no argument(s) {', '.join(map(repr, unknown))} (fingerprint_fields / "
            f"fingerprint_exclude); its arguments: {', '.join(sorted(known))}"
        )


#: The session methods that send a request to the client (and wait for its answer).
_CLIENT_REQUESTS = frozenset({"send_request", "create_message", "list_roots", "elicit", "elicit_form", "elicit_url"})


class _ClientRequestsRefused:
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


def _asking_refused(policy: ToolPolicy, arguments: Mapping[str, Any], context: Context[Any, Any] | None) -> bool:
    """Whether a journaled call of a tool under `policy` must not ask its client: its key is not
    its caller's (no key in `_meta`, none in `key_argument`) and the tool is not `interactive`
    (whose calls without a caller key are never journaled). False without a request (no client)."""
    if context is None or policy.interactive:
        return False
    meta = caller_meta(context) or {}
    if keys.KEY_META in meta or any(name in meta for name in policy.key_meta):
        return False
    return policy.key_argument is None or arguments.get(policy.key_argument) is None


def _without_client_requests(
    server: DurableServer, tool: str, context: Context[Any, Any] | None
) -> Context[Any, Any] | None:
    """`context` whose session refuses every request to the client (`_ClientRequestsRefused`),
    for a call journaled under a key its caller did not give; `context` itself without a request."""
    try:
        request = context.request_context if context is not None else None
    except ValueError:  # a Context made outside a request: there is no client to ask
        return context
    if request is None:
        return context
    guarded = dataclasses.replace(request, session=cast(Any, _ClientRequestsRefused(request.session, tool)))
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


def _check_interactive_tasks(name: str, policy: ToolPolicy) -> None:
    """`ConfigError` for an interactive tool that may run as a task: a task runs in the
    background, outside any request, so the tool has no client to ask (every run would fail)."""
    if policy.interactive and policy.task_support != "forbidden":
        raise ConfigError(
            f"tool {name!r} is interactive (it asks its client while it runs: elicitation, sampling) "
            f"and has task_support={policy.task_support!r}: a task runs in the background with no client "
            "to ask, so it could never finish; register it with task_support='forbidden' (the default) "
            "or not interactive"
        )


def _warn_if_interactive_undeclared(name: str, policy: ToolPolicy, fn: Callable[..., Any]) -> None:
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
