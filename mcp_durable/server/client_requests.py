"""A durable call that must not ask its client, and the registration checks that go with it.

A call journaled under a key its caller did not give (derived from the arguments, or by
`key_fields`/`key_fn`) is answered to every later call with that key, from any session: were the
tool to ask its client (elicitation, sampling, roots) during it, one session's answers would be
replayed to another. Such a call's session refuses every request to the client
(`ClientRequestWithoutKeyError`, released, never kept); an `interactive` tool is journaled only
under its caller's key.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any, cast

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolRequestParams
from pydantic import ValidationError

from .. import keys
from ..errors import ClientRequestWithoutKeyError, ConfigError
from ..policy import ToolPolicy
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


def check_interactive_tasks(name: str, policy: ToolPolicy) -> None:
    """`ConfigError` for an interactive tool that may run as a task: a task runs in the
    background, outside any request, so the tool has no client to ask (every run would fail)."""
    if policy.interactive and policy.task_support != "forbidden":
        raise ConfigError(
            f"tool {name!r} is interactive (it asks its client while it runs: elicitation, sampling) "
            f"and has task_support={policy.task_support!r}: a task runs in the background with no client "
            "to ask, so it could never finish; register it with task_support='forbidden' (the default) "
            "or not interactive"
        )


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
