"""Which upstream session a downstream client's requests go through, and routing the upstream's
requests and log messages to the downstream call that caused them.

The proxy holds one upstream session per set of client capabilities it has met (`Capabilities`:
sampling, with its `context` and `tools` parts, and elicitation), shared by every client that
declared that set (upstream.py's `Upstream`). A client's capabilities are what it can be sent
(`declared_by`): a 2026-07-28 client (that era has no server→client requests) or a connection
without a back-channel (stateless HTTP) counts as declaring none. So the upstream sees, for each
client, a client that can answer what this one can, and lists and does for it what it would
directly: server-everything lists `trigger-sampling-request` only through a sampling session.
Roots are not a part of the key: they are one client's own, which a shared session cannot speak
for, so the proxy declares none upstream.

Each session has its own `Router`. A server→client request from the upstream (sampling,
elicitation) or a log message does not say which of the proxy's tool calls it belongs to, so the
router sends it to the one downstream call in flight on that session. With none in flight, or
several (of different clients), a request is refused with an error to the upstream (it must never
reach another principal's client) and a log message is logged by the proxy only. A log message
below the level a client last set (`logging/setLevel`, kept in `level`) is dropped. Progress needs
none of this: it is bound to its call by the progress token (see server.py). A task's call runs
in the background with no client waiting on it (`background`, on the no-capability session):
while one is in flight no request or log message of its session is routed to any client, since it
may be that call's.

A request the calling client still cannot answer (a URL elicitation to a client that declared
only form mode: the SDK's client declares both modes upstream: `unanswerable`) is refused to the
upstream with a JSON-RPC error that says why, never sent to the client; the upstream's answer to
the call then carries that reason.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from mcp.shared.message import ServerMessageMetadata
from mcp_types import (
    INVALID_REQUEST,
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequest,
    ElicitRequestParams,
    ElicitResult,
    ErrorData,
    LoggingLevel,
    LoggingMessageNotificationParams,
    SamplingCapability,
    SamplingContextCapability,
    SamplingToolsCapability,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

logger = logging.getLogger(__name__)
_R = TypeVar("_R", CreateMessageResult, ElicitResult)
#: The MCP log levels, least severe first (RFC 5424's, as the protocol names them).
LEVELS: tuple[LoggingLevel, ...] = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


@dataclass(frozen=True)
class Capabilities:
    """The client capabilities an upstream session declares, and the key of that session: what
    its clients declared of sampling (and its `context`, `tools` parts) and elicitation."""

    sampling: bool = False
    sampling_context: bool = False
    sampling_tools: bool = False
    elicitation: bool = False

    def describe(self) -> str:
        """A name for logs: `no capabilities`, `sampling+elicitation`, `sampling(context,tools)`…"""
        parts: list[str] = []
        if self.sampling:
            extra = [name for name, on in (("context", self.sampling_context), ("tools", self.sampling_tools)) if on]
            parts.append("sampling" + (f"({','.join(extra)})" if extra else ""))
        if self.elicitation:
            parts.append("elicitation")
        return "+".join(parts) or "no capabilities"

    def sampling_capability(self) -> SamplingCapability | None:
        """The sub-capabilities declared with sampling upstream (the SDK client's `sampling_capabilities`)."""
        if not self.sampling:
            return None
        return SamplingCapability(
            context=SamplingContextCapability() if self.sampling_context else None,
            tools=SamplingToolsCapability() if self.sampling_tools else None,
        )


#: The session of clients that can be sent no request: a 2026-07-28 client, one that declared
#: nothing, a stateless HTTP connection; and of background task runs (no client waits on them).
NO_CAPABILITIES = Capabilities()
#: Every capability the proxy can declare upstream (`proxy --print-config` lists the tools through it).
ALL_CAPABILITIES = Capabilities(sampling=True, sampling_context=True, sampling_tools=True, elicitation=True)


def declared_by(session: Any) -> Capabilities:
    """The capabilities of the client of `session` (a downstream `ServerSession`, or None for no
    client) that the upstream may use: none for the 2026-07-28 era, nor on a connection that
    carries no requests from the server."""
    if session is None or session.protocol_version in MODERN_PROTOCOL_VERSIONS or not session.can_send_request:
        return NO_CAPABILITIES
    declared = session.client_capabilities
    if declared is None:
        return NO_CAPABILITIES
    sampling = declared.sampling
    return Capabilities(
        sampling=sampling is not None,
        sampling_context=sampling is not None and sampling.context is not None,
        sampling_tools=sampling is not None and sampling.tools is not None,
        elicitation=declared.elicitation is not None,
    )


class Router:
    """Tracks the downstream calls in flight on one upstream session; routes its requests and logs
    to the only one."""

    def __init__(self, level: LoggingLevel | None = None) -> None:
        self._in_flight: dict[int, Any] = {}
        #: The least severe log level forwarded (None: every message, as the upstream sends them).
        self.level: LoggingLevel | None = level

    @contextmanager
    def call(self, request_context: Any) -> Iterator[None]:
        """Mark a downstream request (`ServerRequestContext`) in flight for the block."""
        if request_context is None:
            yield
            return
        ident = id(request_context)
        self._in_flight[ident] = request_context
        try:
            yield
        finally:
            self._in_flight.pop(ident, None)

    @contextmanager
    def background(self) -> Iterator[None]:
        """Mark a call in flight that no client waits on (a task's run) for the block: a request
        or log message of the upstream meanwhile may be its, so none reaches any client."""
        marker = _Background()
        self._in_flight[id(marker)] = marker
        try:
            yield
        finally:
            self._in_flight.pop(id(marker), None)

    def _target(self) -> Any | None:
        calls = self._in_flight.values()
        sessions = {id(ctx.session) for ctx in calls}
        if len(sessions) != 1 or any(isinstance(ctx, _Background) for ctx in calls):
            return None
        return next(iter(calls))

    async def sampling(self, context: Any, params: CreateMessageRequestParams) -> CreateMessageResult | ErrorData:
        return await self._forward(CreateMessageRequest(params=params), CreateMessageResult)

    async def elicitation(self, context: Any, params: ElicitRequestParams) -> ElicitResult | ErrorData:
        return await self._forward(ElicitRequest(params=params), ElicitResult)

    async def _forward(self, request: Any, result_type: type[_R]) -> _R | ErrorData:
        """Send the upstream's request to the client of the call in flight; its answer goes back."""
        target = self._target()
        if target is None:
            return self._unroutable(request.method)
        why = unanswerable(target.session, request)
        if why is not None:
            return ErrorData(
                code=INVALID_REQUEST,
                message=f"mcp-durable proxy cannot send {request.method} to the calling client: {why}",
            )
        result: _R = await target.session.send_request(
            request, result_type, metadata=ServerMessageMetadata(related_request_id=target.request_id)
        )
        return result

    async def logging(self, params: LoggingMessageNotificationParams) -> None:
        if self.level is not None and LEVELS.index(params.level) < LEVELS.index(self.level):
            return  # below the level set: the upstream may not filter (or not yet)
        target = self._target()
        if target is None:
            logger.info("upstream log (%s) %s: %s", params.level, params.logger or "-", params.data)
            return
        try:
            await target.session.send_log_message(
                params.level, params.data, params.logger, related_request_id=target.request_id
            )
        except Exception:  # noqa: BLE001 - a log line must never fail the call
            logger.debug("could not forward an upstream log message", exc_info=True)

    def _unroutable(self, method: str) -> ErrorData:
        count = len(self._in_flight)
        if any(isinstance(ctx, _Background) for ctx in self._in_flight.values()):
            why = "a task's call runs in the background, with no client to answer"
        elif count == 0:
            why = "no call is in flight"
        else:
            why = f"{count} calls of several clients are in flight"
        return ErrorData(code=INVALID_REQUEST, message=f"mcp-durable proxy cannot route {method}: {why}")


class _Background:
    """A call in flight with no client (`Router.background`): its own session, never a target."""

    session = None


def unanswerable(session: Any, request: CreateMessageRequest | ElicitRequest) -> str | None:
    """Why the client of `session` (a downstream `ServerSession`) cannot be sent `request`, or
    None if it can: by its protocol era, its connection, and the capabilities it declared."""
    version = session.protocol_version
    if version in MODERN_PROTOCOL_VERSIONS:
        return f"it speaks protocol {version}, which has no requests from a server to its client"
    if not session.can_send_request:
        return "its connection carries no requests from the server (stateless HTTP)"
    declared = session.client_capabilities
    if isinstance(request, CreateMessageRequest):
        sampling = declared.sampling if declared is not None else None
        if sampling is None:
            return "it did not declare the sampling capability"
        if (request.params.tools or request.params.tool_choice) and sampling.tools is None:
            return "it did not declare sampling with tools (sampling.tools)"
        if request.params.include_context not in (None, "none") and sampling.context is None:
            return "it did not declare sampling with context (sampling.context)"
        return None
    elicitation = declared.elicitation if declared is not None else None
    if elicitation is None:
        return "it did not declare the elicitation capability"
    if request.params.mode == "url" and elicitation.url is None:
        return "it did not declare URL elicitation (elicitation.url)"
    # A declaration naming no mode means form mode (the 2025-06-18 shape, still valid).
    if request.params.mode == "form" and elicitation.form is None and elicitation.url is not None:
        return "it did not declare form elicitation (elicitation.form)"
    return None
