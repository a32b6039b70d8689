"""Bearer-token principals for HTTP: a static token map, the simplest real authentication.

`StaticTokenVerifier({"token-a": "alice"})` verifies bearer tokens against a map and makes the
mapped name the request's principal (`AccessToken.client_id`), which scopes its journal records.
Use the SDK's OAuth support (`token_verifier=` any `TokenVerifier`) for anything larger.
Nothing here reads the environment: `DurableServer` reads `MCP_DURABLE_TOKENS` (through
mcp_durable/config.py) only where the environment is trusted (`trust_env`, the command line).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from pydantic import AnyHttpUrl

from ..errors import ConfigError


class StaticTokenVerifier:
    """A `TokenVerifier` over a fixed `{token: principal}` map (compared in constant time)."""

    def __init__(self, tokens: Mapping[str, str]) -> None:
        if not tokens:
            raise ConfigError("a token map needs at least one token")
        self._tokens = dict(tokens)

    async def verify_token(self, token: str) -> AccessToken | None:
        for known, principal in self._tokens.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                return AccessToken(token=token, client_id=principal, scopes=["mcp"], subject=principal)
        return None


#: The base URL token auth is configured with before the server knows where it will listen.
DEFAULT_BASE_URL = "http://127.0.0.1:8000"


def token_auth_kwargs(tokens: Mapping[str, str], base_url: str = DEFAULT_BASE_URL) -> dict[str, Any]:
    """The `MCPServer(...)` keyword arguments that turn on bearer auth with a token map."""
    return {
        "token_verifier": StaticTokenVerifier(tokens),
        "auth": _auth_settings(base_url),
    }


def _auth_settings(base_url: str) -> AuthSettings:
    url = AnyHttpUrl(base_url)
    return AuthSettings(issuer_url=url, resource_server_url=url, validate_token_resource=False)


def point_auth_at(settings: AuthSettings | None, base_url: str) -> AuthSettings | None:
    """Auth settings made with the default base URL, moved to where the server really listens.

    The 401's `WWW-Authenticate` names the protected-resource metadata URL built from this, so a
    server on another port would otherwise send clients to port 8000. Settings given explicitly
    (any other URL) are returned unchanged.
    """
    if settings is None or str(settings.resource_server_url).rstrip("/") != DEFAULT_BASE_URL:
        return settings
    return _auth_settings(base_url)
