"""Configuration from the environment, in one place: every variable's name and its parsing.

No other module of the package reads `os.environ` (a test holds it): the library below the CLI
takes its settings as arguments and falls back to these functions only where a default comes
from the environment, so a reader finds every knob here. Each function reads the environment
when called (tests and subprocesses set variables after import).

| variable | read by | format |
|---|---|---|
| `MCP_DURABLE_JOURNAL` | `journal_url()`: the default journal | a journal URL |
| `MCP_DURABLE_TOKENS` | `tokens()`: bearer tokens → principals | `token=principal[,…]` |
| `MCP_DURABLE_ADMINS` | `admins()`: admin principals | `principal[,…]` |
| `MCP_DURABLE_INSTANCE` | `instance()`: this replica's name | text |
| `MCP_DURABLE_UPSTREAM_TOKEN` | `upstream_token()`: `proxy --upstream-url`'s token | text |
| `PAYMENTS_LEDGER`, `WAREHOUSE_DB`, `MAILER_OUTBOX` | `demo_path()`: the demo tools' files | a path |

The power-loss harness's switch `MCP_DURABLE_TEST_SKIP_FSYNC` (tests only) is read where it
acts, in `journal/fsync.py`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .errors import ConfigError

JOURNAL = "MCP_DURABLE_JOURNAL"
TOKENS = "MCP_DURABLE_TOKENS"
ADMINS = "MCP_DURABLE_ADMINS"
INSTANCE = "MCP_DURABLE_INSTANCE"
UPSTREAM_TOKEN = "MCP_DURABLE_UPSTREAM_TOKEN"
#: Variables holding secrets: never handed to a child process (a stdio upstream).
SECRETS = (TOKENS, UPSTREAM_TOKEN)


def _text(name: str) -> str | None:
    return os.environ.get(name) or None


def journal_url() -> str | None:
    """`$MCP_DURABLE_JOURNAL`, if set and not empty."""
    return _text(JOURNAL)


def comma_list(text: str) -> list[str]:
    """`a, b,,c` → `["a", "b", "c"]`."""
    return [part for part in (item.strip() for item in text.split(",")) if part]


def parse_token_map(text: str) -> dict[str, str]:
    """Parse `token=principal[,token=principal…]` (the `MCP_DURABLE_TOKENS` format)."""
    tokens: dict[str, str] = {}
    for item in comma_list(text):
        token, sep, principal = item.partition("=")
        if not sep or not token or not principal:
            raise ConfigError(f"token map entries are token=principal; got {item!r}")
        tokens[token] = principal
    return tokens


def tokens() -> dict[str, str] | None:
    """The bearer tokens of `$MCP_DURABLE_TOKENS` (None: not set); `ConfigError` if malformed."""
    text = _text(TOKENS)
    return parse_token_map(text) if text else None


def admins() -> frozenset[str]:
    """The admin principals named in `$MCP_DURABLE_ADMINS` (comma-separated), if any."""
    return frozenset(comma_list(os.environ.get(ADMINS, "")))


def instance() -> str | None:
    """This replica's name among several sharing a journal (`$MCP_DURABLE_INSTANCE`)."""
    return _text(INSTANCE)


def upstream_token() -> str | None:
    """The bearer token for the proxy's HTTP upstream (`$MCP_DURABLE_UPSTREAM_TOKEN`)."""
    return _text(UPSTREAM_TOKEN)


def demo_path(variable: str, default: str) -> str:
    """A demo tool's data file: `$variable` if set, else `default`."""
    return _text(variable) or default


def environment() -> dict[str, str]:
    """A copy of this process's environment (what a child process inherits)."""
    return dict(os.environ)


def without_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without mcp-durable's own secrets (`SECRETS`), for a child process."""
    return {name: value for name, value in environ.items() if name not in SECRETS}
