"""The journal: records, the `Journal` protocol, backends, and `open_journal(url)`.

URLs (docs/backends.md): `file://PATH` (a directory; the embedded default), `sqlite:///PATH`,
`postgresql://…`, `memory://`. Where the environment is trusted (the command line, or
`trust_env=True`: mcp_durable/config.py), the variable `MCP_DURABLE_JOURNAL` sets the default.
"""

from __future__ import annotations

from .. import config
from ..errors import ConfigError
from .base import CallCounts, CallCursor, CallQuery, CountQuery, Journal, PurgedCalls
from .masked_urls import display_url
from .model import CallIdentity, CallRecord, CallState, Fence, JournalEntry, JournalStats, Reason

ENV_JOURNAL = config.JOURNAL
DEFAULT_JOURNAL_URL = "file://.mcp-durable/journal"


def default_journal_url(trust_env: bool | None = None) -> str:
    """The journal URL to use when none is given: `$MCP_DURABLE_JOURNAL` where the environment is
    trusted (`trust_env`, None: the process default, `config.trusts_environment`), else the
    embedded default `DEFAULT_JOURNAL_URL`."""
    return config.journal_url(trust_env) or DEFAULT_JOURNAL_URL


def create_journal(url: str | None = None) -> Journal:
    """Build (but do not open) the journal a URL names. Raises `ConfigError` for an unknown URL."""
    url = url or default_journal_url()
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "memory":
        from .memory import MemoryJournal

        return MemoryJournal(url)
    if scheme == "sqlite":
        from .sqlite import SQLiteJournal

        return SQLiteJournal.from_url(url)
    if scheme == "file":
        try:
            from .file import FileJournal
        except ImportError as exc:  # pragma: no cover - until the file journal lands
            raise ConfigError("the file journal is not available in this build") from exc
        return FileJournal.from_url(url)
    if scheme in ("postgres", "postgresql"):
        try:
            from .postgres import PostgresJournal
        except ImportError as exc:
            raise ConfigError("the Postgres journal needs its driver: pip install 'mcp-durable[postgres]'") from exc
        return PostgresJournal.from_url(url)
    raise ConfigError(
        f"unknown journal URL {display_url(url)!r}: use file://DIR, sqlite:///PATH, postgresql://… or memory://"
    )


__all__ = [
    "CallCounts",
    "CallCursor",
    "CallQuery",
    "CallIdentity",
    "CallRecord",
    "CallState",
    "CountQuery",
    "DEFAULT_JOURNAL_URL",
    "Fence",
    "ENV_JOURNAL",
    "Journal",
    "JournalEntry",
    "JournalStats",
    "PurgedCalls",
    "Reason",
    "create_journal",
    "default_journal_url",
    "display_url",
]
