"""A durable face assembled from its parts: what `DurableServer` and `ProxyServer` both are.

Each face is an `MCPServer` that composes one `DurableFace`; neither inherits the other. The
face decides what its tools are and how they run (Python functions for `DurableServer`, an
upstream's tools for the proxy); the parts built here are the same for both:

- the engine on the journal (`options.journal`, else the embedded default);
- `DurableCalls` (server/calls.py): the durable call path and its refusals;
- the `journal://…` resources and their change notifications, scoped by principal;
- the admin tools (with admin principals) and the lookup tool (`lookup_tool=True`);
- MCP tasks in both generations (server/tasks.py), run by the face's own submitter and resumer;
- recovery and retention in the background, and telemetry (`EngineLifetime`).

`FaceOptions` holds the durable keyword arguments of both faces and is the one place the
environment is read, only where trusted (`trust_env`, config.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import ProviderTokenVerifier, TokenVerifier
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import SubscribeRequestParams, SubscriptionsListenRequestParams, UnsubscribeRequestParams

from .. import config, keys
from ..engine import LOCAL_PRINCIPAL, Encoder, Engine, TaskResumer
from ..journal import Journal, create_journal, default_journal_url
from ..limits import DEFAULT_MAX_ARGUMENT_BYTES, DEFAULT_MAX_ARGUMENT_DEPTH, DEFAULT_MAX_RESULT_BYTES, CallLimits
from ..operations.recovery import BackgroundRecovery, ReconcilePass
from ..operations.retention import BackgroundRetention, RetentionSchedule
from ..operations.schedule import check_interval
from ..operations.telemetry import Telemetry, face_telemetry
from ..policy import ToolPolicy
from .admin import admin_tools
from .auth import token_auth_kwargs
from .calls import DurableCalls, PrincipalOf
from .lifetime import BackgroundJobs, EngineLifetime
from .lookup import journal_lookup_tool
from .notifications import JournalNotifier
from .ports import ScopedSubscriptionBus, ToolSpec
from .resources import (
    JSON,
    JournalResources,
    answering_durable_errors,
    install_read_context,
    journal_resources,
    maintenance_body,
)
from .results import replay_answer
from .sdk_internals import bare_tools_call_handler, lowlevel_server, subscription_bus
from .tasks import TaskProtocol, TasksExtension, TaskSubmitter, skip_idle_interceptor

#: Seconds between background reconcile passes (`reconcile_interval`); the first runs at start.
DEFAULT_RECONCILE_INTERVAL = 60.0
#: The retention a server runs by itself unless told otherwise (`retention_schedule`).
DEFAULT_RETENTION_SCHEDULE = RetentionSchedule()


def default_principal(context: Context[Any, Any] | None) -> str:
    """The caller's principal: the authenticated token's identity on HTTP, else `local`."""
    token = get_access_token()
    if token is None:
        return LOCAL_PRINCIPAL
    return keys.token_principal(token.client_id, token.subject, (token.claims or {}).get("iss"))


@dataclass(frozen=True)
class FaceOptions:
    """The durable options of a face, as `DurableServer`'s keyword arguments document them.

    `from_env` is whether the environment fills in what is not given (`config.trusts_environment`
    of `trust_env`): `journal`, `tokens`, `admin_principals` and the replica's name.
    """

    journal: str | Journal | None = None
    principal: PrincipalOf = default_principal
    clock: Callable[[], float] | None = None
    instance_id: str | None = None
    tokens: Mapping[str, str] | None = None
    admin_principals: Collection[str] = ()
    limits: CallLimits = field(default_factory=CallLimits)
    telemetry: Telemetry | bool | None = None
    lookup_tool: bool = False
    reconcile_interval: float | None = DEFAULT_RECONCILE_INTERVAL
    retention_schedule: RetentionSchedule | None = DEFAULT_RETENTION_SCHEDULE
    from_env: bool = False

    @classmethod
    def build(
        cls,
        *,
        journal: str | Journal | None = None,
        principal: PrincipalOf = default_principal,
        clock: Callable[[], float] | None = None,
        instance_id: str | None = None,
        tokens: Mapping[str, str] | None = None,
        admin_principals: Collection[str] = (),
        max_argument_bytes: int | None = DEFAULT_MAX_ARGUMENT_BYTES,
        max_result_bytes: int | None = DEFAULT_MAX_RESULT_BYTES,
        max_argument_depth: int | None = DEFAULT_MAX_ARGUMENT_DEPTH,
        telemetry: Telemetry | bool | None = None,
        lookup_tool: bool = False,
        reconcile_interval: float | None = DEFAULT_RECONCILE_INTERVAL,
        retention_schedule: RetentionSchedule | None = DEFAULT_RETENTION_SCHEDULE,
        trust_env: bool | None = None,
    ) -> FaceOptions:
        """The options from the faces' keyword arguments (`DurableServer`'s documents them), the
        limits checked and `trust_env` resolved (`config.trusts_environment`)."""
        return cls(
            journal=journal,
            principal=principal,
            clock=clock,
            instance_id=instance_id,
            tokens=tokens,
            admin_principals=admin_principals,
            limits=CallLimits.checked(max_argument_bytes, max_result_bytes, max_argument_depth),
            telemetry=telemetry,
            lookup_tool=lookup_tool,
            reconcile_interval=reconcile_interval,
            retention_schedule=retention_schedule,
            from_env=config.trusts_environment(trust_env),
        )

    @classmethod
    def split(cls, kwargs: Mapping[str, Any]) -> tuple[FaceOptions, dict[str, Any]]:
        """`kwargs` parted into the options (`build`'s keywords) and the rest, for `MCPServer`."""
        names = inspect.signature(cls.build).parameters
        mine = {name: value for name, value in kwargs.items() if name in names}
        return cls.build(**mine), {name: value for name, value in kwargs.items() if name not in names}

    def __post_init__(self) -> None:
        # A bad schedule is a programmer's error at construction, not at the first pass.
        check_interval("reconcile_interval", self.reconcile_interval)
        if self.retention_schedule is not None:
            check_interval("retention_schedule.interval", self.retention_schedule.interval)

    def sdk_kwargs(self, kwargs: dict[str, Any], positional: int) -> dict[str, Any]:
        """`MCPServer`'s keyword arguments `kwargs` (after `positional` positional ones) with what
        the face adds: bearer auth for `tokens` (else `$MCP_DURABLE_TOKENS`, where trusted) unless
        the caller set up auth itself; this package's version as `serverInfo.version` unless one
        is given; the MCP tasks extension (returned as `kwargs["extensions"][-1]`)."""
        kwargs = dict(kwargs)
        tokens = self.tokens
        if tokens is None and "token_verifier" not in kwargs and "auth_server_provider" not in kwargs:
            tokens = config.tokens(self.from_env)
        if tokens:
            # Bearer tokens mapped to principals: requests without a valid token are refused (401).
            kwargs.update(token_auth_kwargs(tokens))
        if positional < 6 and "version" not in kwargs:  # version is MCPServer's 7th parameter
            from ..version import __version__

            kwargs["version"] = __version__
        kwargs["extensions"] = [*(kwargs.get("extensions") or ()), TasksExtension()]
        return kwargs


class DurableFace:
    """The durable parts of one face, assembled on `server` (built with `options.sdk_kwargs`).

    It is the `DurableHost` (server/ports.py) its helpers see: the engine, the policies of the
    durable tools by name (the face keeps them up to date), who is asking and who is an admin.
    The face supplies what differs: `submit_task` and `resume_task` (how a task of one of its
    tools is created and resumed), `result_encoder` (how a value a reconcile hook found becomes
    a tool's result) and `output_schema_of` (a tool's declared output schema).
    """

    def __init__(
        self,
        server: MCPServer[Any],
        options: FaceOptions,
        *,
        submit_task: TaskSubmitter,
        resume_task: TaskResumer,
        result_encoder: Callable[[str], Encoder | None],
        output_schema_of: Callable[[str], dict[str, Any] | None],
        sdk_kwargs: Mapping[str, Any],
    ) -> None:
        self.server = server
        self.principal_of = options.principal
        journal = options.journal
        store = (
            create_journal(journal or default_journal_url(options.from_env))
            if not isinstance(journal, Journal)
            else journal
        )
        # The lifecycle is journaled per replica when replicas are named ($MCP_DURABLE_INSTANCE):
        # on a shared journal one replica's `running` must not read as another's unclean stop.
        replica = config.instance(options.from_env)
        process_id = f"server/{server.name}" + (f"/{replica}" if replica else "")
        engine_kwargs: dict[str, Any] = {"instance_id": options.instance_id, "process_id": process_id}
        if options.clock is not None:
            engine_kwargs["clock"] = options.clock
        self.engine = Engine(store, **engine_kwargs)
        # A repeat's answer is made once per record the engine keeps for repeats (its replay cache).
        self.engine.render_replay = replay_answer
        #: The durable tools' policies by name.
        self.policies: dict[str, ToolPolicy] = {}
        # `admin_principals` (or `$MCP_DURABLE_ADMINS`, trusted) see every record and may operate.
        self.admin_principals: frozenset[str] = frozenset(options.admin_principals) or config.admins(options.from_env)
        self.telemetry: Telemetry | None = face_telemetry(options.telemetry)  # None or True: the global providers
        if self.telemetry is not None:
            self.telemetry.attach(self.engine)
        #: What verifies bearer tokens on HTTP (None: no auth), as the SDK builds it from the same
        #: arguments; the console verifies its sign-in tokens with it.
        self.token_verifier: TokenVerifier | None = sdk_kwargs.get("token_verifier")
        if self.token_verifier is None and sdk_kwargs.get("auth_server_provider") is not None:
            self.token_verifier = ProviderTokenVerifier(sdk_kwargs["auth_server_provider"])
        self.calls = DurableCalls(self.engine, self.principal_of, options.limits, output_schema_of, self.telemetry)
        # Registered in this order: the change notifier's engine listener runs before the tasks'.
        self.recovery: BackgroundRecovery | None = None
        self.retention: BackgroundRetention | None = None
        self.resources = self._register_journal_resources()
        self.notifier = self._register_notifications()
        if self.admin_principals:
            self._register_tools(admin_tools(self))
        self.tasks = self._register_tasks(sdk_kwargs["extensions"], submit_task, resume_task)
        if options.lookup_tool:
            self._register_tools([journal_lookup_tool(self)])
        # In-doubt calls of `reconcile` tools are reconciled at start and every interval (recovery.py).
        if options.reconcile_interval is not None:
            self.recovery = BackgroundRecovery(
                self.engine,
                self.policies,
                result_encoder,
                options.reconcile_interval,
                after_pass=self._after_recovery_pass,
            )
        # Expired records, their steps and old lifecycle entries purged on a schedule (retention.py).
        if options.retention_schedule is not None:
            self.retention = BackgroundRetention(self.engine, options.retention_schedule)
        jobs = [job.run_forever for job in (self.recovery, self.retention) if job is not None]
        self.lifetime = EngineLifetime(self.engine, self.telemetry, BackgroundJobs(server.name, jobs))

    # -- the host its helpers see (server/ports.py) -------------------------------------------------

    @property
    def journal(self) -> Journal:
        return self.engine.journal

    def request_principal(self, request: ServerRequestContext[Any, Any] | None) -> str:
        """The principal of a low-level request (None: no request being served), by `principal_of`."""
        return self.principal_of(None if request is None else Context(request_context=request, mcp_server=self.server))

    def is_admin(self, principal: str) -> bool:
        """Whether `principal` is one of the `admin_principals`: sees every record, may operate."""
        return principal in self.admin_principals

    # -- the parts, registered on the server --------------------------------------------------------

    def _register_journal_resources(self) -> JournalResources:
        """The `journal://…` resources (server/resources.py), every read scoped by principal."""
        views = JournalResources(self, lambda: maintenance_body(self.retention, self.recovery))
        for resource in journal_resources(views):
            register = self.server.resource(
                resource.uri,
                name=resource.name,
                mime_type=JSON,
                description=resource.read.__doc__,
                security=resource.security,
            )
            register(answering_durable_errors(resource.read))
        install_read_context(lowlevel_server(self.server))
        return views

    def _register_notifications(self) -> JournalNotifier:
        """Record changes announced in both protocol eras, scoped by principal (server/notifications.py)."""
        notifier = JournalNotifier(self, subscription_bus(self.server))
        self.engine.listeners.append(notifier.on_change)
        lowlevel = lowlevel_server(self.server)
        lowlevel.add_request_handler("resources/subscribe", SubscribeRequestParams, notifier.subscribe)
        lowlevel.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, notifier.unsubscribe)
        if lowlevel.get_request_handler("subscriptions/listen") is not None:  # None: `subscriptions=False`
            lowlevel.add_request_handler(
                "subscriptions/listen", SubscriptionsListenRequestParams, notifier.listen_handler()
            )
        bus = subscription_bus(self.server)
        if isinstance(bus, ScopedSubscriptionBus):  # e.g. PgSubscriptionBus: across replicas
            notifier.forward_across(bus)
        return notifier

    def _register_tools(self, tools: list[ToolSpec] | tuple[ToolSpec, ...]) -> None:
        """The face's own plain (not durable) tools: the admin and lookup tools."""
        for tool in tools:
            MCPServer.add_tool(self.server, tool.fn, name=tool.name, annotations=tool.annotations)

    def _register_tasks(self, extensions: list[Any], submit: TaskSubmitter, resume: TaskResumer) -> TaskProtocol:
        """MCP tasks in both generations (server/tasks.py); in-doubt tasks are resumed at start."""
        tasks = TaskProtocol(self, submit)
        extension = extensions[-1]
        assert isinstance(extension, TasksExtension)  # added last by `FaceOptions.sdk_kwargs`
        extension.protocol = tasks
        self.server.middleware.append(tasks.middleware)
        # The SDK wraps every `tools/call` in its extensions' interceptors; ours acts only on calls
        # that may become tasks, so the others skip the chain (server/tasks.py).
        lowlevel = lowlevel_server(self.server)
        composed = lowlevel.get_request_handler("tools/call")
        assert composed is not None  # MCPServer registers it, wrapped in the interceptors
        lowlevel.add_request_handler(
            "tools/call",
            composed.params_type,
            skip_idle_interceptor(extensions, composed.handler, bare_tools_call_handler(self.server), self),
        )
        self.engine.listeners.append(tasks.on_change)
        self.engine.task_resumer = resume
        self.engine.task_policy = self.policies.get
        return tasks

    async def _after_recovery_pass(self, report: ReconcilePass) -> None:
        if self.telemetry is not None:
            await self.telemetry.refresh(self.journal)  # in-doubt calls other replicas marked, too


def face_of(server: object) -> DurableFace | None:
    """The durable parts `server` composes (a `DurableServer`, a `ProxyServer`); None for any
    other server (a plain `MCPServer` has no journal)."""
    face = getattr(server, "face", None)
    return face if isinstance(face, DurableFace) else None
