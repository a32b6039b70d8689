"""`postgresql://…` journal URLs: our own query parameters, split from what libpq receives.

    postgresql://user:pass@host:5432/db?schema=mcp_durable&pool_max=10&pool_timeout=5

Our parameters (stripped before the URL reaches psycopg):

| parameter | default | meaning |
|---|---|---|
| `schema` | `mcp_durable` | the schema holding every table (created if missing) |
| `pool_min` / `pool_max` | 1 / 10 | connections kept open / at most, per journal (per replica) |
| `pool_timeout` | 5 | seconds a call waits for a pooled connection before `JournalError` |
| `statement_timeout` | 15 | seconds any one statement may run (server-side `statement_timeout`) |
| `poll` | 1.0 | seconds between fallback re-reads of a call in flight (NOTIFY is the fast path) |

Everything else (`sslmode`, `application_name`, `connect_timeout`, …) goes to libpq unchanged;
`connect_timeout` defaults to 5 seconds, so a database that does not answer gives a
`JournalError` in seconds rather than hanging for the TCP timeout, and TCP keepalives are on
(`keepalives_idle=10&keepalives_interval=5&keepalives_count=3`) unless the URL says otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from ...errors import ConfigError
from ..masked_urls import display_url

DEFAULT_SCHEMA = "mcp_durable"
#: Postgres identifiers are at most 63 bytes; the schema also names the NOTIFY channel
#: (`mcp_durable.<schema>`), so it is kept short enough for both.
_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,47}$")
_DEFAULTS: dict[str, float] = {
    "pool_min": 1,
    "pool_max": 10,
    "pool_timeout": 5.0,
    "statement_timeout": 15.0,
    "poll": 1.0,
}
_OURS = ("schema", *_DEFAULTS)
#: libpq settings added unless the URL gives them: fail to connect in seconds, and notice a
#: peer that vanished without closing the connection (a partition, a dead host) in ~25 s.
_LIBPQ_DEFAULTS = (
    ("connect_timeout", "5"),
    ("keepalives", "1"),
    ("keepalives_idle", "10"),
    ("keepalives_interval", "5"),
    ("keepalives_count", "3"),
)


@dataclass(frozen=True, slots=True)
class PostgresSettings:
    """A parsed journal URL: `conninfo` for libpq, and the journal's own settings."""

    conninfo: str
    schema: str = DEFAULT_SCHEMA
    pool_min: int = 1
    pool_max: int = 10
    pool_timeout: float = 5.0
    statement_timeout: float = 15.0
    poll: float = 1.0

    @property
    def channel(self) -> str:
        """The NOTIFY channel on which changes to this schema's call records are announced."""
        return f"mcp_durable.{self.schema}"

    @classmethod
    def from_url(cls, url: str) -> PostgresSettings:
        parts = urlsplit(url)
        if parts.scheme.lower() not in ("postgres", "postgresql"):
            raise ConfigError(f"not a Postgres URL: {display_url(url)!r}")
        ours: dict[str, str] = {}
        theirs: list[tuple[str, str]] = []
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if name in _OURS:
                ours[name] = value
            else:
                theirs.append((name, value))
        given = {name for name, _ in theirs}
        theirs.extend((name, value) for name, value in _LIBPQ_DEFAULTS if name not in given)
        # quote, not quote_plus: libpq decodes %20 but not + as a space.
        query = urlencode(theirs, quote_via=quote)
        conninfo = urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))
        schema = ours.get("schema", DEFAULT_SCHEMA)
        if not _SCHEMA_NAME.match(schema):
            raise ConfigError(
                f"invalid schema {schema!r} in journal URL: use 1-48 letters, digits or _, not starting with a digit"
            )
        try:
            settings = cls(
                conninfo=conninfo,
                schema=schema,
                pool_min=int(ours.get("pool_min", _DEFAULTS["pool_min"])),
                pool_max=int(ours.get("pool_max", _DEFAULTS["pool_max"])),
                pool_timeout=float(ours.get("pool_timeout", _DEFAULTS["pool_timeout"])),
                statement_timeout=float(ours.get("statement_timeout", _DEFAULTS["statement_timeout"])),
                poll=float(ours.get("poll", _DEFAULTS["poll"])),
            )
        except ValueError as exc:
            raise ConfigError(f"invalid number in journal URL query: {exc}") from None
        if not 0 <= settings.pool_min <= settings.pool_max or settings.pool_max < 1:
            raise ConfigError("pool_max must be >= 1 and pool_min between 0 and pool_max")
        if min(settings.pool_timeout, settings.statement_timeout, settings.poll) <= 0:
            raise ConfigError("pool_timeout, statement_timeout and poll must be positive seconds")
        return settings
