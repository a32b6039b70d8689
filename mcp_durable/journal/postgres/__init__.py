"""`postgresql://…` (or `postgres://…`): the journal for several replicas on one Postgres.

The driver is an optional extra (`pip install 'mcp-durable[postgres]'`); importing this package
without it raises `ImportError`, which `create_journal` turns into a `ConfigError` naming the
command. See `journal.py` for how claims, wake-ups and the pool work, `schema.py` for the
migrations, `settings.py` for the URL's query parameters.
"""

from __future__ import annotations

import psycopg  # noqa: F401 - imported first: a missing extra fails here, with ImportError
import psycopg_pool  # noqa: F401

from .journal import PostgresJournal
from .listener import Listener
from .settings import PostgresSettings

__all__ = ["Listener", "PostgresJournal", "PostgresSettings"]
