"""Who is looking at the console: the MCP endpoint's bearer tokens, in a header or a session.

A browser cannot easily send a bearer header, so the login form takes the token once, verifies it
with the server's own `TokenVerifier`, and sets a session cookie (`HttpOnly`, `SameSite=Strict`,
path-scoped to the console). The cookie holds a random session id, never the token; the token
stays in this process's memory and is verified again on every request, so a token the verifier
stops accepting ends its sessions. A request with `Authorization: Bearer …` is served without a
session. Without a verifier (a server with no auth) every request is `local`, as over MCP.

CSRF: every form carries a per-session token, checked on every POST (constant time), besides
`SameSite=Strict`; a POST whose `Origin` is not the console's own origin is refused as well.
Host/Origin headers are checked as the MCP endpoint checks them (DNS-rebinding protection).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

from mcp.server.auth.provider import AccessToken, TokenVerifier
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request

COOKIE = "mcp_durable_console"
SESSION_SECONDS = 8 * 3600
MAX_SESSIONS = 10_000
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def loopback_security(host: str) -> TransportSecuritySettings | None:
    """The SDK's own choice for its MCP endpoint (`streamable_http_app(host=…)`): DNS-rebinding
    protection on for a loopback host, off otherwise (a reverse proxy decides then). The mounted
    console takes the endpoint's settings themselves; this is for the console on its own."""
    if host not in LOOPBACK:
        return None
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
    )


@dataclass(frozen=True, slots=True)
class Viewer:
    """The identity of one request: its principal, whether it may act, and its CSRF token."""

    principal: str
    admin: bool
    csrf: str
    session: str | None  # the session id (cookie), None for a bearer header or no auth


@dataclass(slots=True)
class _Session:
    token: str | None
    csrf: str
    expires: float


class Sessions:
    """Console sessions of this process: session id -> the verified bearer token and CSRF token."""

    def __init__(self, verifier: TokenVerifier | None) -> None:
        self.verifier = verifier
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._secret = secrets.token_bytes(32)

    async def verify(self, token: str) -> AccessToken | None:
        if self.verifier is None or not token:
            return None
        access = await self.verifier.verify_token(token)
        if access is None or (access.expires_at is not None and access.expires_at < int(time.time())):
            return None
        return access

    def open(self, token: str | None) -> str:
        """A new session for a verified `token` (None: no auth configured); returns its id."""
        sid = secrets.token_urlsafe(32)
        self._sessions[sid] = _Session(token, secrets.token_urlsafe(32), time.monotonic() + SESSION_SECONDS)
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return sid

    def close(self, sid: str | None) -> None:
        if sid:
            self._sessions.pop(sid, None)

    async def identify(self, request: Request) -> tuple[AccessToken | None, str, str | None] | None:
        """`(token, csrf, session id)` of an authenticated request, or None (refuse it).

        A bearer header wins over a cookie; an invalid one is refused even with a good cookie.
        Without a verifier (no auth configured) headers are ignored, as the MCP endpoint does.
        """
        header = request.headers.get("authorization", "")
        if self.verifier is not None and header.lower().startswith("bearer "):
            bearer = header[7:].strip()
            access = await self.verify(bearer)
            if access is None:
                return None
            # No session: a CSRF token bound to the token itself (a header is never sent by a
            # cross-site form anyway).
            digest = hmac.new(self._secret, hashlib.sha256(bearer.encode()).digest(), "sha256").hexdigest()
            return access, digest, None
        sid = request.cookies.get(COOKIE)
        session = self._sessions.get(sid) if sid else None
        if session is None or sid is None or session.expires < time.monotonic():
            self.close(sid)
            return None
        if self.verifier is None:
            return None, session.csrf, sid
        access = await self.verify(session.token or "")
        if access is None:  # the verifier stopped accepting the token: the session ends with it
            self.close(sid)
            return None
        return access, session.csrf, sid


def csrf_ok(expected: str, given: str | None) -> bool:
    return bool(given) and hmac.compare_digest(expected.encode(), (given or "").encode())


def same_origin(request: Request) -> bool:
    """A POST's `Origin`, when sent, names the console's own origin (scheme and host)."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return origin == f"{request.url.scheme}://{request.headers.get('host', '')}"
