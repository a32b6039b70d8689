"""The console's pages and forms: a Starlette app over a `ConsoleSource`.

    GET  /              overview          GET  /call?principal=&tool=&key=   one call
    GET  /calls         the call list     GET  /in-doubt                     calls in doubt
    GET  /act?…         confirm an action POST /act                          do it (admins, CSRF)
    GET  /login         the token form    POST /login, POST /logout
    GET  /events        live updates (server-sent events)   GET /static/…    CSS and the live script

Plain HTML forms: everything but live updates works with JavaScript off. Identities travel in
query strings, never in paths (a key may hold `/`). A record the viewer may not see answers
exactly like one that does not exist.

A refusal (`DurableError`) is answered with the HTTP status and title of its code's row in
`wire_errors.WIRE`, the one table every face uses: 403 `forbidden`, 404 `not_found`, 409
`operator_error` (an action that does not apply), 503 `journal_unavailable`, …; a `ConfigError`
is no refusal and propagates (a 500, and a traceback in the log).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import anyio
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..engine.operators import RESOLUTIONS
from ..errors import CallNotFoundError, DurableError, ForbiddenError, OperatorError
from ..journal.model import CallIdentity, CallState
from ..server.redact import iso, record_summary
from ..server.resources import decode_cursor, encode_cursor
from ..wire_errors import WIRE, Wire, wire_of
from .auth import COOKIE, SESSION_SECONDS, Sessions, Viewer, csrf_ok, same_origin
from .queries import CallFilter, call_detail, call_page, chart, in_doubt, overview, parse_time
from .source import ConsoleSource

HERE = Path(__file__).parent
#: The verdicts on a call nobody finished (in doubt, released, or pending past its lease).
DECISIONS = {
    "completed": "resolve as completed",
    "not_applied": "resolve as not applied",
    "failed": "resolve as failed",
    "forget": "forget",
}
#: Every operator action the console offers, by the name its form posts.
ACTIONS = {**DECISIONS, "cancel": "cancel", "rerun": "re-run"}


def actions_for(state: CallState) -> dict[str, str]:
    """The actions that apply to a call in `state` (the engine refuses any other with OperatorError):
    verdicts on an undecided call, cancel of a running or in-doubt one, re-run of a finished one."""
    available: dict[str, str] = {}
    if state in (CallState.IN_DOUBT, CallState.RELEASED, CallState.PENDING):
        available.update(DECISIONS)
    if state in (CallState.PENDING, CallState.IN_DOUBT):
        available["cancel"] = ACTIONS["cancel"]
    if state.is_final:
        available["rerun"] = ACTIONS["rerun"]
    return available


#: Seconds between keep-alive comments on an idle live-update stream.
PING_SECONDS = 15.0


def _templates() -> Any:
    try:
        import jinja2
    except ImportError as exc:  # pragma: no cover - the extra is missing
        from ..errors import ConfigError

        raise ConfigError("the console needs Jinja2: pip install 'mcp-durable[console]'") from exc
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, undefined=jinja2.StrictUndefined
    )
    env.filters["json"] = lambda value: orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
    env.filters["q"] = lambda params: urlencode({k: v for k, v in params.items() if v not in (None, "")})
    return env


class Console:
    """The console's request handlers, bound to one source and one session store."""

    def __init__(self, source: ConsoleSource, security: Any = None) -> None:
        from mcp.server.transport_security import TransportSecurityMiddleware

        self.source = source
        self.sessions = Sessions(source.verifier)
        self.guard = TransportSecurityMiddleware(security)
        self.env = _templates()

    # -- plumbing -----------------------------------------------------------------------------------

    def render(self, request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        base = request.scope.get("root_path", "")
        html = self.env.get_template(name).render(base=base, request=request, **context)
        return HTMLResponse(
            html,
            status_code=status,
            headers={
                "Cache-Control": "no-store",
                "X-Frame-Options": "DENY",
                "Referrer-Policy": "same-origin",
                "Content-Security-Policy": "default-src 'self'; style-src 'self'; img-src 'self' data:; "
                "frame-ancestors 'none'; form-action 'self'",
            },
        )

    async def viewer(self, request: Request) -> Viewer | None:
        found = await self.sessions.identify(request)
        if found is None:
            return None
        access, csrf, sid = found
        principal = self.source.principal(access)
        return Viewer(principal, principal in self.source.admins, csrf, sid)

    def page(
        self, handler: Callable[[Request, Viewer], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """Guard a handler: Host/Origin checked, the viewer identified (else the login page, 401)."""

        async def endpoint(request: Request) -> Response:
            refused = await self.guard.validate_request(request)
            if refused is not None:
                return refused
            viewer = await self.viewer(request)
            if viewer is None:
                if self.sessions.verifier is None and request.method == "GET":
                    return self._anonymous(request)
                if request.method != "GET" or request.url.path.endswith("/events"):
                    return PlainTextResponse(
                        "unauthorized: sign in with a bearer token",
                        status_code=401,
                        headers={"WWW-Authenticate": "Bearer"},
                    )
                return self.render(request, "login.html", status=401, viewer=None, error=None, next=request.url.path)
            if request.method == "POST":
                form = await request.form()
                if not same_origin(request) or not csrf_ok(viewer.csrf, _text(form.get("csrf"))):
                    return PlainTextResponse("forbidden: missing or wrong CSRF token", status_code=403)
            try:
                return await handler(request, viewer)
            except ValueError as exc:
                return self.render(request, "error.html", status=400, viewer=viewer, message=str(exc))
            except DurableError as exc:  # the journal cannot be read right now, no such call, …
                return self.refused(request, viewer, wire_of(exc), exc.message, exc.code)

        return endpoint

    def refused(self, request: Request, viewer: Viewer, wire: Wire, message: str, code: str) -> HTMLResponse:
        """The error page of a refusal: its code's status and title (`wire_errors.WIRE`), its message."""
        return self.render(
            request,
            "error.html",
            status=wire.status,
            viewer=viewer,
            title=wire.title,
            message=message[:1].upper() + message[1:],
            code=code,
        )

    def _anonymous(self, request: Request) -> Response:
        # No auth configured (as the MCP endpoint then): a session for `local`, for the CSRF token.
        sid = self.sessions.open(None)
        response = RedirectResponse(str(request.url), status_code=303)
        self._set_cookie(request, response, sid)
        return response

    def _set_cookie(self, request: Request, response: Response, sid: str) -> None:
        response.set_cookie(
            COOKIE,
            sid,
            max_age=SESSION_SECONDS,
            path=request.scope.get("root_path", "") or "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    # -- sign in and out ----------------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        refused = await self.guard.validate_request(request)
        if refused is not None:
            return refused
        return self.render(request, "login.html", viewer=None, error=None, next=request.query_params.get("next", ""))

    async def login(self, request: Request) -> Response:
        refused = await self.guard.validate_request(request)
        if refused is not None or not same_origin(request):
            return refused or PlainTextResponse("forbidden: cross-origin sign-in", status_code=403)
        form = await request.form()
        token = _text(form.get("token")).strip()
        base = request.scope.get("root_path", "")
        if self.sessions.verifier is None or await self.sessions.verify(token) is None:
            return self.render(
                request, "login.html", status=401, viewer=None, next="", error="That token is not accepted."
            )
        target = _text(form.get("next"))
        if not target.startswith(base + "/") or target.startswith("//"):
            target = base + "/"
        response = RedirectResponse(target, status_code=303)
        self._set_cookie(request, response, self.sessions.open(token))
        return response

    async def logout(self, request: Request, viewer: Viewer) -> Response:
        self.sessions.close(viewer.session)
        base = request.scope.get("root_path", "")
        response = RedirectResponse(base + "/login", status_code=303)
        response.delete_cookie(COOKIE, path=base or "/")
        return response

    # -- pages --------------------------------------------------------------------------------------

    def scope(self, viewer: Viewer) -> str | None:
        return None if viewer.admin else viewer.principal

    async def overview(self, request: Request, viewer: Viewer) -> Response:
        async with self.source.reading() as journal:
            now = self.source.clock()
            data = await overview(journal, self.scope(viewer), now)
            recovery = await self.source.recovery(journal, self.scope(viewer))
        oldest = data["oldest_in_doubt"]
        return self.render(
            request,
            "overview.html",
            viewer=viewer,
            counts=data["counts"],
            chart=chart(data["per_minute"]),
            in_doubt=data["in_doubt"],
            oldest=record_summary(oldest) if oldest else None,
            recovery=recovery,
            journal_url=self.source.journal_url if viewer.admin else None,
            watch="*",
        )

    async def calls(self, request: Request, viewer: Viewer) -> Response:
        q = request.query_params
        state = q.get("state") or None
        if state is not None and state not in {s.value for s in CallState}:
            raise ValueError(f"state must be one of {', '.join(s.value for s in CallState)}")
        limit = int(q.get("limit") or 50)
        if not 1 <= limit <= 500:
            raise ValueError("limit must be between 1 and 500")
        wanted = CallFilter(
            tool=q.get("tool") or None,
            state=CallState(state) if state else None,
            principal=(q.get("principal") or None) if viewer.admin else None,
            since=parse_time(q.get("since")),
            until=parse_time(q.get("until")),
            key_prefix=q.get("key_prefix", ""),
            limit=limit,
        )
        try:
            cursor = decode_cursor(q["cursor"]) if q.get("cursor") else None
        except Exception:  # noqa: BLE001 - MCPError(INVALID_PARAMS) from the shared decoder
            raise ValueError("invalid page cursor: follow the page links") from None
        async with self.source.reading() as journal:
            records, following = await call_page(journal, self.scope(viewer), wanted, cursor)
            tools = sorted((await journal.stats()).calls_by_tool) if viewer.admin else None
        filters = {k: q.get(k, "") for k in ("tool", "state", "principal", "since", "until", "key_prefix", "limit")}
        return self.render(
            request,
            "calls.html",
            viewer=viewer,
            calls=[record_summary(r) for r in records],
            filters=filters,
            states=[s.value for s in CallState],
            tools=tools,
            next_cursor=encode_cursor(following) if following else None,
            paged=bool(q.get("cursor")),
            watch="*",
        )

    def _identity(self, request: Request, viewer: Viewer) -> CallIdentity:
        q = request.query_params
        tool, key = q.get("tool", ""), q.get("key", "")
        if not tool or not key:
            raise ValueError("a call is named by tool and key")
        owner = q.get("principal") or viewer.principal
        return CallIdentity(owner, tool, key)

    async def call(self, request: Request, viewer: Viewer) -> Response:
        identity = self._identity(request, viewer)
        detail = None
        if viewer.admin or identity.principal == viewer.principal:
            async with self.source.reading() as journal:
                sensitive = await self.source.sensitive(journal, identity.tool)
                detail = await call_detail(journal, identity, sensitive)
        if detail is None:  # another's record answers exactly like a missing one
            raise CallNotFoundError(identity.tool, identity.key)
        from ..uris import record_uri

        return self.render(
            request,
            "call.html",
            viewer=viewer,
            d=detail,
            v=detail["view"],
            ident={"principal": identity.principal, "tool": identity.tool, "key": identity.key},
            actions=actions_for(detail["record"].state) if self._can_act(viewer) else {},
            done=request.query_params.get("done"),
            watch=record_uri(identity.tool, identity.key),
        )

    async def in_doubt(self, request: Request, viewer: Viewer) -> Response:
        async with self.source.reading() as journal:
            records = await in_doubt(journal, self.scope(viewer), self.source.clock())
        rows = [{**record_summary(r), "error": r.error, "lease_expired": r.state == CallState.PENDING} for r in records]
        actions = {**DECISIONS, "cancel": ACTIONS["cancel"]}  # every row is in doubt, or pending past its lease
        return self.render(
            request,
            "in_doubt.html",
            viewer=viewer,
            calls=rows,
            actions=actions if self._can_act(viewer) else {},
            watch="*",
        )

    # -- operator actions ---------------------------------------------------------------------------

    def _can_act(self, viewer: Viewer) -> bool:
        return viewer.admin and self.source.engine is not None

    async def confirm(self, request: Request, viewer: Viewer) -> Response:
        if not self._can_act(viewer):
            return self._forbidden(request, viewer)
        identity = self._identity(request, viewer)
        action = request.query_params.get("action", "")
        if action not in ACTIONS:
            raise ValueError(f"action must be one of {', '.join(ACTIONS)}")
        async with self.source.reading() as journal:
            record = await journal.get(identity)
        if record is None:
            raise CallNotFoundError(identity.tool, identity.key)
        return self.render(
            request,
            "confirm.html",
            viewer=viewer,
            action=action,
            label=ACTIONS[action],
            call=record_summary(record),
            error=None,
            note="",
            result="",
            from_step="",
        )

    async def act(self, request: Request, viewer: Viewer) -> Response:
        if not self._can_act(viewer):
            return self._forbidden(request, viewer)
        engine = self.source.engine
        assert engine is not None
        form = await request.form()
        identity = CallIdentity(_text(form.get("principal")), _text(form.get("tool")), _text(form.get("key")))
        action, note, result_text = _text(form.get("action")), _text(form.get("note")), _text(form.get("result"))
        from_step = _text(form.get("from_step"))
        by = f"console:{viewer.principal}"
        try:
            if action == "forget":
                await engine.forget(identity, by=by, note=note)
            elif action in RESOLUTIONS:
                payload = _payload(action, result_text, note)
                await engine.resolve(
                    identity,
                    action,
                    payload=payload,
                    note=note or by,
                    retention=self.source.retention(identity.tool),
                    by=by,
                )
            elif action == "cancel":  # through the engine: a run in this process stops at once
                await engine.cancel(identity, by=by, note=note, retention=self.source.retention(identity.tool))
            elif action == "rerun":
                await engine.rerun(
                    identity,
                    from_step=_from_step(_text(form.get("from_step"))),
                    by=by,
                    note=note,
                    retention=self.source.retention(identity.tool),
                )
            else:
                raise OperatorError(f"unknown action {action!r}")
        except DurableError as exc:  # the form again, with the refusal, at its code's status
            summary = {"principal": identity.principal, "tool": identity.tool, "key": identity.key}
            return self.render(
                request,
                "confirm.html",
                status=wire_of(exc).status,
                viewer=viewer,
                action=action,
                label=ACTIONS.get(action, action),
                call=summary,
                error=exc.message,
                code=exc.code,
                note=note,
                result=result_text,
                from_step=from_step,
            )
        base = request.scope.get("root_path", "")
        query = urlencode(
            {"principal": identity.principal, "tool": identity.tool, "key": identity.key, "done": ACTIONS[action]}
        )
        return RedirectResponse(f"{base}/call?{query}", status_code=303)

    def _forbidden(self, request: Request, viewer: Viewer) -> Response:
        if not viewer.admin:
            raise ForbiddenError(viewer.principal)
        # An admin on a console that cannot write (a file journal beside its server): refused the same way.
        return self.refused(
            request, viewer, WIRE["forbidden"], "read-only: this console cannot write the journal", ForbiddenError.code
        )

    # -- live updates -------------------------------------------------------------------------------

    async def events(self, request: Request, viewer: Viewer) -> Response:
        """Server-sent events: `change` with a record URI (or `journal://stats`) whenever a record
        the viewer may see changes. Nothing listens for changes while no such stream is open."""
        return ChangeStream(self.source.changes(viewer.principal))


class ChangeStream(Response):
    """A `text/event-stream` of change hints, until the client goes away.

    Three tasks: one forwards changes, one sends a keep-alive comment every `PING_SECONDS`, one
    waits for the disconnect and then ends the others (whose `finally` unsubscribes).
    """

    def __init__(self, changes: AsyncIterator[str]) -> None:
        super().__init__()
        self.changes = changes
        # No content-length: the body never ends while the client stays.
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-store"),
            (b"x-accel-buffering", b"no"),
        ]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        lock = anyio.Lock()

        async def emit(chunk: bytes) -> None:
            async with lock:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})

        async def forward() -> None:
            async for uri in self.changes:
                await emit(f"event: change\ndata: {uri}\n\n".encode())

        async def ping() -> None:
            while True:
                await anyio.sleep(PING_SECONDS)
                await emit(b": ping\n\n")

        try:
            async with anyio.create_task_group() as tasks:
                await emit(b"retry: 3000\n\n")
                tasks.start_soon(forward)
                tasks.start_soon(ping)
                while (await receive())["type"] != "http.disconnect":
                    pass
                tasks.cancel_scope.cancel()
        except* OSError:  # the client went away mid-send: nothing left to tell it
            pass


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _payload(resolution: str, result_text: str, note: str) -> bytes | None:
    """The result an operator's resolution replays, built as `journal_resolve` builds it."""
    from ..server.admin import operator_payload

    if resolution == "not_applied":
        return None
    result: Any = None
    if result_text.strip():
        try:
            result = orjson.loads(result_text)
        except orjson.JSONDecodeError as exc:
            raise OperatorError(f"the result must be JSON: {exc}") from None
    elif resolution == "completed":
        raise OperatorError("resolving as completed needs the result to replay (JSON)")
    return operator_payload(result, failed=resolution == "failed", note=note)


def console_app(source: ConsoleSource, security: Any = None) -> Starlette:
    """The console as an ASGI app, to mount at `/console`. `security` is the Host/Origin policy
    (`TransportSecuritySettings`, None: unchecked), the MCP endpoint's own when mounted beside it."""
    console = Console(source, security)
    page = console.page
    routes = [
        Route("/", page(console.overview)),
        Route("/calls", page(console.calls)),
        Route("/call", page(console.call)),
        Route("/in-doubt", page(console.in_doubt)),
        Route("/act", page(console.confirm), methods=["GET"]),
        Route("/act", page(console.act), methods=["POST"]),
        Route("/events", page(console.events)),
        Route("/login", console.login_form, methods=["GET"]),
        Route("/login", console.login, methods=["POST"]),
        Route("/logout", page(console.logout), methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes)
    app.state.console = console
    return app


__all__ = ["Console", "console_app", "iso"]


def _from_step(text: str) -> int | None:
    """The re-run form's "from durable step" field: empty for every step, else a whole number."""
    if not text.strip():
        return None
    if not text.strip().isdigit():
        raise OperatorError(f"from step must be a whole number (0 for the first step), not {text!r}")
    return int(text)
