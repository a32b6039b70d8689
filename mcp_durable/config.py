"""Configuration from the environment, in one place: every variable's name and its parsing.

No other module of the package reads `os.environ` (a test holds it). The library reads none of
these variables unless it is asked to: like httpx's `trust_env`, `DurableServer(trust_env=…)`
turns the environment on for one server, and `use_environment()` sets the process default that
`trust_env=None` follows. The default is off, so a server built in a library user's code (a test
process, an application) is configured by that code alone: `MCP_DURABLE_TOKENS` set in a shell
cannot silently turn on bearer auth there. The command line (`mcp-durable serve`, `proxy`,
`console`, `journal …`) turns it on before it loads a target module: a served module's
`DurableServer("payments")` then takes its journal, tokens, admins and replica name from the
environment, as docs/cli.md describes. Each function reads the environment when called (tests
and subprocesses set variables after import).

| variable | read by | format |
|---|---|---|
| `MCP_DURABLE_JOURNAL` | `journal_url()`: the default journal | a journal URL |
| `MCP_DURABLE_TOKENS` | `tokens()`: bearer tokens → principals | `token=principal[,…]` |
| `MCP_DURABLE_ADMINS` | `admins()`: admin principals | `principal[,…]` |
| `MCP_DURABLE_INSTANCE` | `instance()`: this replica's name | text |
| `MCP_DURABLE_UPSTREAM_TOKEN` | `upstream_token()`: `proxy --upstream-url`'s token | text |
| `PAYMENTS_LEDGER`, `WAREHOUSE_DB`, `MAILER_OUTBOX` | `demo_path()`: the demo tools' files | a path |

The five `MCP_DURABLE_…` readers answer "not set" unless the environment is trusted
(`trusts_environment`). The demo stand-ins' paths are not settings of mcp-durable (they stand
for a downstream system's own configuration) and are read whenever a stand-in is built without
a path. `environment()` copies the environment for a child process (the proxy's stdio
upstream); it configures nothing here.

The power-loss harness's switch `MCP_DURABLE_TEST_SKIP_FSYNC` (tests only) is read where it
acts, in `journal/fsync.py`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from .errors import ConfigError

JOURNAL = "MCP_DURABLE_JOURNAL"
TOKENS = "MCP_DURABLE_TOKENS"
ADMINS = "MCP_DURABLE_ADMINS"
INSTANCE = "MCP_DURABLE_INSTANCE"
UPSTREAM_TOKEN = "MCP_DURABLE_UPSTREAM_TOKEN"
#: Variables holding secrets: never handed to a child process (a stdio upstream).
SECRETS = (TOKENS, UPSTREAM_TOKEN)

# The process default of `trust_env`: a module global, not a context variable, because an
# embedder turning it on at start-up means every thread and task of the process.
_trusted = False


def use_environment(on: bool = True) -> bool:
    """Set the process default of `trust_env` (what `trust_env=None` means); returns the
    previous default. The command line calls it before it loads a target; an application that
    wants its servers configured like `mcp-durable serve`'s calls it once at start-up."""
    global _trusted
    previous, _trusted = _trusted, on
    return previous


@contextmanager
def environment_used(on: bool = True) -> Iterator[None]:
    """`use_environment(on)` for the duration of the block, the previous default restored after
    (the command's `main`, which tests also call in their own process)."""
    previous = use_environment(on)
    try:
        yield
    finally:
        use_environment(previous)


def trusts_environment(trust_env: bool | None = None) -> bool:
    """Whether settings come from the environment: `trust_env` when given, else the process
    default (`use_environment`; off unless the command line or the application turned it on)."""
    return _trusted if trust_env is None else trust_env


def _text(name: str) -> str | None:
    return os.environ.get(name) or None


def _setting(name: str, trust_env: bool | None) -> str | None:
    """`$name` if the environment is trusted and it is set and not empty, else None."""
    return _text(name) if trusts_environment(trust_env) else None


def journal_url(trust_env: bool | None = None) -> str | None:
    """`$MCP_DURABLE_JOURNAL`, if trusted, set and not empty."""
    return _setting(JOURNAL, trust_env)


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


def tokens(trust_env: bool | None = None) -> dict[str, str] | None:
    """The bearer tokens of `$MCP_DURABLE_TOKENS` (None: not set, or not trusted); `ConfigError`
    if malformed."""
    text = _setting(TOKENS, trust_env)
    return parse_token_map(text) if text else None


def admins(trust_env: bool | None = None) -> frozenset[str]:
    """The admin principals named in `$MCP_DURABLE_ADMINS` (comma-separated), if trusted and any."""
    return frozenset(comma_list(_setting(ADMINS, trust_env) or ""))


def instance(trust_env: bool | None = None) -> str | None:
    """This replica's name among several sharing a journal (`$MCP_DURABLE_INSTANCE`), if trusted."""
    return _setting(INSTANCE, trust_env)


def upstream_token(trust_env: bool | None = None) -> str | None:
    """The bearer token for the proxy's HTTP upstream (`$MCP_DURABLE_UPSTREAM_TOKEN`), if trusted."""
    return _setting(UPSTREAM_TOKEN, trust_env)


def demo_path(variable: str, default: str) -> str:
    """A demo tool's data file: `$variable` if set, else `default`."""
    return _text(variable) or default


def environment() -> dict[str, str]:
    """A copy of this process's environment (what a child process inherits)."""
    return dict(os.environ)


def without_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without mcp-durable's own secrets (`SECRETS`), for a child process."""
    return {name: value for name, value in environ.items() if name not in SECRETS}
