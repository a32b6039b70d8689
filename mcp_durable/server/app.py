"""`DurableServer`: an `MCPServer` whose durable tools run once per key.

Tools registered with `durable=` (a `ToolPolicy`, or `True` for the defaults) are wrapped: every
`tools/call` of one goes through the engine, which claims the key in the journal, runs the tool
once, persists its result and replays it for every repeat. Other tools run untouched.

The server is an assembly: its durable parts (engine, call path, journal resources, tasks,
background jobs) are one `DurableFace` (server/assembly.py), the same parts the proxy composes;
this module adds what is particular to Python tools: their registration, the validation of their
arguments, and how one runs.

The seam is `MCPServer.call_tool`, which every transport and both protocol eras reach through
`_handle_call_tool`. We override it rather than use `Extension.intercept_tool_call` because
here a tool's deliberate `ToolError` (a result to persist) and an unexpected exception (to
release, so a retry runs again) are still distinct exceptions; in an interceptor both have
already become identical `isError` results.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypedDict, TypeVar, Unpack

import orjson
from mcp import MCPError
from mcp.server.auth.provider import TokenVerifier
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.tools import Tool
from mcp_types import CallToolRequestParams, CallToolResult, InputRequiredResult, TextContent, ToolAnnotations
from mcp_types.version import MODERN_PROTOCOL_VERSIONS as MODERN
from pydantic import ValidationError

from .. import config, keys, limits
from ..engine import Encoder, Engine, Runner, ToolOutcome
from ..errors import ClientRequestWithoutKeyError, ConfigError, DurableError
from ..journal import CallRecord, Journal, create_journal
from ..operations.recovery import BackgroundRecovery
from ..operations.retention import BackgroundRetention, RetentionSchedule
from ..operations.telemetry import Telemetry
from ..policy import ToolPolicy, as_policy
from ..steps import DurableCall
from . import prevalidated
from .assembly import (
    DEFAULT_RECONCILE_INTERVAL,
    DEFAULT_RETENTION_SCHEDULE,
    DurableFace,
    FaceOptions,
    default_principal,
)
from .calls import caller_meta
from .client_requests import (
    asking_refused,
    first_round,
    input_params,
    task_context,
    warn_if_interactive_undeclared,
    without_client_requests,
)
from .notifications import JournalNotifier
from .prevalidated import PreparedTool
from .resources import JournalResources
from .results import META_REPLAYED, dump_result
from .sdk_internals import registered_tool, subscription_bus
from .tasks import TaskInputFirst, TaskProtocol

#: Names this replica among several sharing one journal (its lifecycle process is server/NAME/REPLICA).
ENV_INSTANCE = config.INSTANCE

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
    refused (`non_finite_argument`). `telemetry` adds durable attributes, child spans and metrics
    to every durable call (docs/telemetry.md): None (the default) or True through the global
    OpenTelemetry providers, a `Telemetry` through its own; False emits nothing. `lookup_tool=True` adds
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
        options = FaceOptions.build(
            journal=journal,
            principal=principal,
            clock=clock,
            instance_id=instance_id,
            tokens=tokens,
            admin_principals=admin_principals,
            max_argument_bytes=max_argument_bytes,
            max_result_bytes=max_result_bytes,
            max_argument_depth=max_argument_depth,
            telemetry=telemetry,
            lookup_tool=lookup_tool,
            reconcile_interval=reconcile_interval,
            retention_schedule=retention_schedule,
            trust_env=trust_env,  # settings not passed come from the environment only where trusted
        )
        self._user_lifespan = lifespan
        kwargs = options.sdk_kwargs(kwargs, len(args))
        super().__init__(name, *args, lifespan=self._durable_lifespan, **kwargs)
        #: The durable parts (server/assembly.py): engine, call path, resources, tasks, background jobs.
        self.face = DurableFace(
            self,
            options,
            submit_task=self._submit_requested_task,
            resume_task=self._resume_task,
            result_encoder=self.result_encoder,
            output_schema_of=self.output_schema_of,
            sdk_kwargs=kwargs,
        )
        self.calls = self.face.calls

    # -- the parts, as users of the server name them ----------------------------------------------

    @property
    def engine(self) -> Engine:
        return self.face.engine

    @property
    def journal(self) -> Journal:
        return self.face.engine.journal

    @property
    def policies(self) -> dict[str, ToolPolicy]:
        """The durable tools' policies by name (`add_tool` keeps them)."""
        return self.face.policies

    @property
    def principal_of(self) -> Callable[[Context[Any, Any] | None], str]:
        return self.face.principal_of

    @property
    def admin_principals(self) -> frozenset[str]:
        return self.face.admin_principals

    @property
    def token_verifier(self) -> TokenVerifier | None:
        """What verifies bearer tokens on HTTP (None: no auth); the console's sign-in uses it."""
        return self.face.token_verifier

    @property
    def telemetry(self) -> Telemetry | None:
        return self.face.telemetry

    @property
    def recovery(self) -> BackgroundRecovery | None:
        return self.face.recovery

    @property
    def retention(self) -> BackgroundRetention | None:
        return self.face.retention

    @property
    def tasks(self) -> TaskProtocol:
        return self.face.tasks

    @property
    def journal_views(self) -> JournalResources:
        return self.face.resources

    @property
    def journal_notifier(self) -> JournalNotifier:
        return self.face.notifier

    @property
    def max_argument_bytes(self) -> int | None:
        return self.face.calls.limits.argument_bytes

    @property
    def max_result_bytes(self) -> int | None:
        return self.face.calls.limits.result_bytes

    @property
    def max_argument_depth(self) -> int | None:
        return self.face.calls.limits.argument_depth

    def request_principal(self, request: ServerRequestContext[Any, Any] | None) -> str:
        """The principal of a low-level request (None: no request being served), by `principal_of`."""
        return self.face.request_principal(request)

    def is_admin(self, principal: str) -> bool:
        """Whether `principal` is one of the `admin_principals`: sees every record, may operate."""
        return self.face.is_admin(principal)

    def use_journal(self, journal: str | Journal) -> None:
        """Serve on `journal` (a URL or a `Journal`) instead of the one given at construction.

        For `mcp-durable serve --journal URL`, whose target module may have built its server with
        a journal of its own: the engine (calls, leases, lifecycle) then uses this one only. Only
        before the server starts; raises `ConfigError` after.
        """
        self.engine.use_journal(create_journal(journal) if isinstance(journal, str) else journal)

    @asynccontextmanager
    async def _durable_lifespan(self, app: MCPServer[Any]) -> AsyncIterator[Any]:
        # The engine, telemetry and background jobs from the first connection to the last
        # (server/lifetime.py), around the application's own lifespan.
        async with self.face.lifetime.served():
            if self._user_lifespan is None:
                yield {}
            else:
                async with self._user_lifespan(app) as state:
                    yield state

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
            warn_if_interactive_undeclared(tool_name, policy, fn)
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
        """`error` as the refusal result of a call of `tool` (`DurableCalls.refuse`)."""
        return self.calls.refuse(tool, error, key, text)

    def output_schema_of(self, tool: str) -> dict[str, Any] | None:
        """The output schema `tool` declares to clients (None: none, or no such tool)."""
        registered = registered_tool(self, tool)
        return registered.output_schema if registered is not None else None

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        policy = self.policies.get(name)
        tool = registered_tool(self, name)
        if policy is None or tool is None:  # not durable (e.g. an admin tool of ours, which may refuse)
            return await self.calls.plain(super().call_tool(name, arguments, context), name)
        prepared = self._prepared_tool(name, tool, policy)
        memo_key: bytes | None = None
        known: prevalidated.Validated | None = None
        model: Any = None
        try:
            # What JSON cannot journal is refused before validation (a too-deep value fails
            # obscurely inside it); a request seen before as a replay is not validated again.
            if limits.check_argument_values(name, arguments, self.calls.limits.argument_depth):
                memo_key = prepared.memo_key(arguments)
                known = prepared.recall(memo_key) if memo_key is not None else None
            if known is None:
                model, validated, canonical = self._validated(
                    tool, name, arguments, checked=True, check_validated=prepared.check_validated
                )
                fingerprint = keys.policy_fingerprint(policy, validated, canonical=canonical)
            else:
                validated, canonical, fingerprint = known
                limits.check_arguments_size(name, canonical, self.calls.limits.argument_bytes)
        except ValidationError:
            return await super().call_tool(name, arguments, context)  # the SDK's own error result
        except DurableError as exc:
            return self.refuse(name, exc)  # nothing claimed: a corrected retry with the same key runs
        run = self._runner(name, arguments, context, policy, model, prepared)
        result = await self.calls.run(
            name, policy, validated, canonical, context, run, prepared.encode, fingerprint=fingerprint
        )
        if memo_key is not None and known is None and result.meta and result.meta.get(META_REPLAYED) is True:
            # Remembered once a request is repeated (a retry): first calls do not fill the memo.
            prepared.remember(memo_key, (validated, canonical, fingerprint))
        return result

    def _validated(
        self, tool: Tool, name: str, arguments: dict[str, Any], *, checked: bool = False, check_validated: bool = True
    ) -> tuple[Any, dict[str, Any], bytes]:
        """The arguments' validated model, its JSON form and that form's canonical JSON.

        Validated first: a call with bad arguments is refused before any claim, so a corrected
        retry with the same key still runs (validation errors are not saved). Raises
        `ValidationError`, or a `DurableError`: `non_finite_argument`, `arguments_too_deep`,
        `too_large`, `not_serialisable`. `checked`: the raw `arguments` passed
        `limits.check_argument_values` already. `check_validated`: validation may make a
        non-finite number of finite input (`prevalidated.makes_non_finite`).
        """
        # What JSON cannot journal is refused before validation (a too-deep value fails
        # obscurely inside it) and, where validation can make one of finite input (a string
        # `"nan"` read as a float, a JSON string the SDK parses: `"[NaN]"`), checked again on
        # what it made of the arguments: the SDK dumps NaN and ±Infinity as `null`.
        if not checked:
            limits.check_argument_values(name, arguments, self.calls.limits.argument_depth)
        parsed = tool.fn_metadata.pre_parse_json(arguments)
        model = tool.fn_metadata.arg_model.model_validate(parsed)
        if check_validated or any(parsed[key] is not value for key, value in arguments.items()):
            limits.check_argument_values(name, model, None)
        validated: dict[str, Any] = model.model_dump(mode="json", by_alias=True)
        return model, validated, limits.checked_arguments(name, validated, self.calls.limits.argument_bytes)

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
        instead of the SDK validating again (`prevalidated`), through the tool's own `Tool.run`
        when `prepared` is given. Without it (a task resumed from the journal, a request whose validation was
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
            # (Worked out only for a tool that can ask, or one that answered `input_required`.)
            guarded = can_ask and call is not None and asking_refused(policy, arguments, context)
            called = without_client_requests(self, name, context) if guarded else context
            try:
                if model is not None and prepared is not None:
                    called_with = called if called is not None else self._bare_context()
                    result, payload = await prepared.run(arguments, model, called_with)
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
                return self.calls.protocol_error_outcome(name, policy, exc)
            finally:
                if token is not None:
                    prevalidated.done(token)
            if isinstance(result, InputRequiredResult) and (
                guarded or (call is not None and asking_refused(policy, arguments, context))
            ):
                raise ClientRequestWithoutKeyError(name)  # 2026-07-28's way of asking the client
            return self.calls.outcome(name, policy, result, payload, from_exception=from_exception)

        return run

    def _bare_context(self) -> Context[Any, Any]:
        """The context `MCPServer.call_tool` makes for a call without one (a task run in the background)."""
        return Context(mcp_server=self, subscriptions=subscription_bus(self))

    def result_encoder(self, name: str) -> Encoder | None:
        """How a value a reconcile hook found for tool `name` becomes its stored result (None: not a tool here)."""
        tool = registered_tool(self, name)
        return None if tool is None else _encoder(tool)

    # -- tasks (server/tasks.py serves the protocol; these run them) -------------------------------

    async def submit_task(
        self,
        name: str,
        arguments: dict[str, Any],
        context: Context[Any, Any] | None,
        *,
        answers: CallToolRequestParams | None = None,
    ) -> CallRecord:
        """Create (or find, for a repeated key) the task for one call of durable tool `name`.

        Returns at once with the task's record; the tool runs in the background, outside the
        request (it gets no request context; an `interactive` tool gets one whose requests to
        the client are the task's questions to its requestor, `client_requests.task_context`),
        once per key. `answers`: the params of a 2026-07-28 request that answered the tool's
        resolvers before the task was created. Raises `ValidationError`,
        `limits.LimitExceeded` (bad arguments) or a `DurableError` (the call is refused).
        """
        policy = self.policies[name]
        tool = registered_tool(self, name)
        assert tool is not None
        model, validated, canonical = self._validated(tool, name, arguments)
        request = _request_of(context)
        asking = task_context(self, self.engine.tasks.ask, request, answers) if policy.interactive else None
        return await self.engine.submit(
            tool=name,
            policy=policy,
            arguments=validated,
            meta=caller_meta(context),
            run=self._runner(name, arguments, asking, policy, model),
            encode=_encoder(tool),
            principal=self.principal_of(context),
            canonical=canonical,
        )

    async def _submit_requested_task(
        self, name: str, arguments: dict[str, Any], request: ServerRequestContext[Any, Any]
    ) -> CallRecord:
        """`submit_task` for the low-level request being served (the tasks' `TaskSubmitter`).

        An interactive tool's `Resolve` parameters are asked first, in this request, on 2026-07-28
        (`client_requests.first_round`): while they have questions, the request is answered with
        them (`TaskInputFirst`) and no task is created."""
        policy = self.policies.get(name)
        tool = registered_tool(self, name)
        answers = None
        if policy is not None and policy.interactive and tool is not None and request.protocol_version in MODERN:
            try:
                questions = await first_round(self, tool, arguments, request)
            except ValidationError:
                questions = None  # bad arguments: refused by `submit_task` as any call's are
            if questions is not None:
                raise TaskInputFirst(questions)
            answers = input_params(request)
        return await self.submit_task(
            name, arguments, Context(request_context=request, mcp_server=self), answers=answers
        )

    async def _resume_task(self, record: CallRecord) -> None:
        """The engine's `task_resumer`: drive an in-doubt task on by its tool's policy."""
        name = record.identity.tool
        policy = self.policies.get(name)
        tool = registered_tool(self, name)
        if policy is None or tool is None or record.arguments is None:
            return  # the tool is gone: the task stays in doubt for an operator
        arguments = orjson.loads(record.arguments)
        asking = task_context(self, self.engine.tasks.ask) if policy.interactive else None
        run = self._runner(name, arguments, asking, policy)
        await self.engine.resume(record.identity, policy, run, _encoder(tool))


def _request_of(context: Context[Any, Any] | None) -> ServerRequestContext[Any, Any] | None:
    """The low-level request `context` serves (None: no request)."""
    try:
        return context.request_context if context is not None else None
    except ValueError:
        return None


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
