"""The operator console: the journal as web pages (needs the `console` extra: Jinja2).

    from mcp_durable.console import mount_console
    app = server.streamable_http_app(host="127.0.0.1")
    mount_console(app, server)                   # what `mcp-durable serve --transport http` does

`mcp-durable console --journal URL` serves it on its own, beside a running server. The pages,
their security (the MCP endpoint's bearer tokens and Host/Origin rules, CSRF-checked forms) and
their live updates are described in docs/console.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .source import ConsoleSource, JournalSource, ServerSource

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer
    from starlette.applications import Starlette

PATH = "/console"


def mount_console(app: Starlette, server: MCPServer[Any], path: str = PATH) -> None:
    """Mount the console of `server` (a `DurableServer` or `ProxyServer`) on `app` (its
    `streamable_http_app`) at `path`, with the MCP endpoint's own Host/Origin settings. Raises
    `ConfigError` for a server without a journal."""
    from starlette.routing import Mount

    from ..errors import ConfigError
    from ..server.assembly import face_of
    from .app import console_app

    face = face_of(server)
    if face is None:
        raise ConfigError(f"{type(server).__name__} has no journal: the console needs a DurableServer or ProxyServer")

    try:
        security = server.session_manager.security_settings
    except RuntimeError:  # no streamable HTTP app built: no Host/Origin settings to share
        security = None
    app.router.routes.append(Mount(path, console_app(ServerSource(face), security)))


def standalone_app(source: ConsoleSource, host: str, path: str = PATH) -> Any:
    """The console on its own: served at `path`, `/` redirecting there, the journal closed on stop."""
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.responses import RedirectResponse
    from starlette.routing import Mount, Route

    from .app import console_app
    from .auth import loopback_security

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        try:
            yield
        finally:
            await source.aclose()

    async def home(request: Any) -> RedirectResponse:
        return RedirectResponse(path + "/", status_code=303)

    routes = [Route("/", home), Mount(path, console_app(source, loopback_security(host)))]
    return Starlette(routes=routes, lifespan=lifespan)


__all__ = ["ConsoleSource", "JournalSource", "ServerSource", "mount_console", "standalone_app"]
