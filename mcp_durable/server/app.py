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

import logging
import os
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp_types import CallToolResult, InputRequiredResult, TextContent, ToolAnnotations
from pydantic import ValidationError

from .. import limits
from ..engine import LOCAL_PRINCIPAL, Engine, ToolOutcome
from ..errors import DurableError, JournalError
from ..journal import Journal, create_journal, display_url
from ..policy import ToolPolicy, as_policy
from ..steps import DurableCall
from . import prevalidated
from .auth import token_auth_kwargs, tokens_from_env
from .resources import register_journal_resources
from .results import answer, dump_result, refusal

#: Names this replica among several sharing one journal (its lifecycle process is server/NAME/REPLICA).
ENV_INSTANCE = "MCP_DURABLE_INSTANCE"

_F = TypeVar("_F", bound=Callable[..., Any])
logger = logging.getLogger(__name__)


def default_principal(context: Context[Any, Any] | None) -> str:
    """The caller's principal: the authenticated token's identity on HTTP, else `local`."""
    token = get_access_token()
    if token is None:
        return LOCAL_PRINCIPAL
    issuer = (token.claims or {}).get("iss")
    # A subject equal to the client id (a static token map's principal) is not repeated: `alice`.
    subject = token.subject if token.subject and token.subject != token.client_id else ""
    parts = [token.client_id, subject, str(issuer) if issuer else ""]
    return "/".join(parts).rstrip("/")


class DurableServer(MCPServer[Any]):
    """An `MCPServer` with a journal; tools registered `durable=` are deduplicated by key.

    `journal` is a URL (`file://…`, `sqlite:///…`, `postgresql://…`, `memory://`), a `Journal`,
    or None for `$MCP_DURABLE_JOURNAL` or the embedded default. `principal` maps a request to
    the identity records are scoped by. `clock` is injected into the engine for tests. `tokens`
    (`{bearer_token: principal}`, default `$MCP_DURABLE_TOKENS`) turns on bearer auth on HTTP.
    `max_argument_bytes` (1 MiB) / `max_result_bytes` (16 MiB) bound what a durable call journals
    (`mcp_durable.limits`); `None` lifts a limit.
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
        **kwargs: Any,
    ) -> None:
        if tokens is None and "token_verifier" not in kwargs and "auth_server_provider" not in kwargs:
            tokens = tokens_from_env()
        if tokens:
            # Bearer tokens mapped to principals: requests without a valid token are refused (401).
            kwargs.update(token_auth_kwargs(tokens))
        self._user_lifespan = lifespan
        self._lifespan_users = 0
        super().__init__(name, *args, lifespan=self._durable_lifespan, **kwargs)
        store = journal if journal is not None and not isinstance(journal, str) else create_journal(journal)
        # The lifecycle is journaled per replica when replicas are named ($MCP_DURABLE_INSTANCE):
        # on a shared journal one replica's `running` must not read as another's unclean stop.
        replica = os.environ.get(ENV_INSTANCE)
        process_id = f"server/{self.name}" + (f"/{replica}" if replica else "")
        engine_kwargs: dict[str, Any] = {"instance_id": instance_id, "process_id": process_id}
        if clock is not None:
            engine_kwargs["clock"] = clock
        self.engine = Engine(store, **engine_kwargs)
        self.principal_of = principal
        # Size limits of what a durable call journals (see mcp_durable/limits.py; None = no limit).
        self.max_argument_bytes = limits.check_limit("max_argument_bytes", max_argument_bytes)
        self.max_result_bytes = limits.check_limit("max_result_bytes", max_result_bytes)
        self.policies: dict[str, ToolPolicy] = {}
        # Journal resources, change notifications and admin tools (server/resources.py);
        # `admin_principals` (default `$MCP_DURABLE_ADMINS`) see every record and may operate.
        self.admin_principals: frozenset[str] = frozenset(admin_principals)
        register_journal_resources(self)

    @property
    def journal(self) -> Journal:
        return self.engine.journal

    @asynccontextmanager
    async def _durable_lifespan(self, app: MCPServer[Any]) -> AsyncIterator[Any]:
        # Entered once per stdio/in-memory connection and once by the HTTP session manager:
        # the journal stays open while any of them runs.
        try:
            await self.engine.start()
        except JournalError as exc:
            # Serve anyway (full disk, read-only directory, locked database): every durable call
            # retries the start and is refused with `journal_unavailable` until it succeeds, so
            # the fault clears without a restart.
            logger.warning("journal %s unavailable at start: %s", display_url(self.journal.url), exc)
        self._lifespan_users += 1
        try:
            if self._user_lifespan is None:
                yield {}
            else:
                async with self._user_lifespan(app) as state:
                    yield state
        finally:
            self._lifespan_users -= 1
            if self._lifespan_users == 0:
                try:
                    await self.engine.aclose()
                except JournalError as exc:  # e.g. a full disk: the next boot sees an unclean stop
                    logger.warning("journal %s: the stop could not be journaled: %s", display_url(self.journal.url), exc)

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
        """Register a tool; with `durable=` it runs once per key (see `ToolPolicy`)."""
        policy = as_policy(durable)
        if policy is not None and policy.idempotent:
            # The hint is now a guarantee: advertise it.
            base = annotations or ToolAnnotations()
            annotations = base.model_copy(update={"idempotent_hint": True})
        super().add_tool(
            fn, name=name, title=title, description=description, annotations=annotations,
            icons=list(icons) if icons is not None else None, meta=meta, structured_output=structured_output,
        )  # fmt: skip
        tool_name = name or fn.__name__
        if policy is not None:
            self.policies[tool_name] = policy
            tool = self._tool_manager.get_tool(tool_name)
            if tool is not None:
                prevalidated.install(tool)  # the face validates; the SDK need not again
        else:
            self.policies.pop(tool_name, None)

    def tool(
        self,
        name: str | None = None,
        title: str | None = None,
        description: str | None = None,
        annotations: ToolAnnotations | None = None,
        icons: Sequence[Any] | None = None,
        meta: dict[str, Any] | None = None,
        structured_output: bool | None = None,
        *,
        durable: ToolPolicy | bool | None = None,
    ) -> Callable[[_F], _F]:
        """Decorator form of `add_tool`: `@server.tool(durable=ToolPolicy(key_fields=("order_id",)))`."""
        if callable(name):
            raise TypeError("use @server.tool() (with parentheses), not @server.tool")

        def decorator(fn: _F) -> _F:
            self.add_tool(fn, name, title, description, annotations, icons, meta, structured_output, durable=durable)
            return fn

        return decorator

    # -- the call ---------------------------------------------------------------------------------

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        policy = self.policies.get(name)
        tool = self._tool_manager.get_tool(name)
        if policy is None or tool is None:
            return await super().call_tool(name, arguments, context)
        try:
            # Validate first: a call with bad arguments is refused before any claim, so a
            # corrected retry with the same key still runs (validation errors are not saved).
            model = tool.fn_metadata.arg_model.model_validate(tool.fn_metadata.pre_parse_json(arguments))
        except ValidationError:
            return await super().call_tool(name, arguments, context)  # the SDK's own error result
        validated = model.model_dump(mode="json", by_alias=True)
        try:
            canonical = limits.checked_arguments(name, validated, self.max_argument_bytes)
        except limits.LimitExceeded as exc:
            raise ToolError(exc.message) from exc  # a bad request: the SDK's own error, before any claim
        meta = _request_meta(context)
        key_hint: str | None = None

        async def run(call: DurableCall | None) -> ToolOutcome:
            # What the SDK hands the function (`prevalidated`); made only when the tool runs.
            token = prevalidated.validated_as(arguments, model.model_dump_one_level())
            try:
                result = await MCPServer.call_tool(self, name, arguments, context)
            except UnexpectedToolError as exc:
                if policy.exceptions != "persist":
                    raise
                result = CallToolResult(content=[TextContent(type="text", text=str(exc))], is_error=True)
            except ToolError as exc:
                result = CallToolResult(content=[TextContent(type="text", text=str(exc))], is_error=True)
            finally:
                prevalidated.done(token)
            if isinstance(result, InputRequiredResult):
                # Interim (multi-round) answers are never journaled as the call's result.
                return ToolOutcome(result, b"", is_error=False, final=False)
            final = result  # narrowed to CallToolResult, for the closure
            try:
                payload = limits.result_payload(name, lambda: dump_result(final), self.max_result_bytes)
            except limits.LimitExceeded as exc:
                if policy.exceptions != "persist":
                    raise  # the engine releases the claim; answered below
                text = limits.outcome_text(exc, released=False)
                result = CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)
                payload = dump_result(result)
            return ToolOutcome(result, payload, is_error=bool(result.is_error))

        def encode(value: Any) -> ToolOutcome:
            result = tool.fn_metadata.convert_result(value)
            assert isinstance(result, CallToolResult)
            return ToolOutcome(result, dump_result(result), is_error=bool(result.is_error))

        try:
            outcome = await self.engine.execute(
                tool=name, policy=policy, arguments=validated, meta=meta, run=run, encode=encode,
                principal=self.principal_of(context), canonical=canonical,
            )  # fmt: skip
        except DurableError as exc:
            key_hint = getattr(exc, "key", None)
            return refusal(exc, key_hint)
        except limits.LimitExceeded as exc:  # the result could not be journaled; the claim was released
            text = limits.outcome_text(exc, released=True)
            return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)
        if isinstance(outcome.value, InputRequiredResult):
            return outcome.value
        return answer(outcome)


def _request_meta(context: Context[Any, Any] | None) -> Mapping[str, Any] | None:
    if context is None:
        return None
    try:
        # `Context.request_context` is a pydantic private attribute behind `__getattr__`, several
        # µs on every durable call; its storage (`__pydantic_private__`) is read directly first.
        private = context.__pydantic_private__
        request = private.get("_request_context") if private else None
        meta = (request if request is not None else context.request_context).meta
    except (ValueError, AttributeError, LookupError):
        return None
    if meta is None:
        return None
    if isinstance(meta, Mapping):
        return meta
    dumped = getattr(meta, "model_dump", None)
    return dumped(by_alias=True) if dumped is not None else None
