"""The suite's own Postgres hygiene: every schema a test makes is dropped when the test ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import PG_URL, drop_scratch_schemas, make_journal_factory

pytestmark = pytest.mark.postgres


def _schema_exists(name: str) -> bool:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (name,)).fetchone() is not None


async def test_a_postgres_journal_made_in_a_test_body_is_dropped_with_the_tests_scratch_schemas(
    tmp_path: Path,
) -> None:
    """Before: `make_journal_factory("postgres")` outside the `journal_factory` fixture (the
    fencing test, the hardening tests) made a schema nobody dropped: one per suite run."""
    factory = make_journal_factory("postgres", tmp_path)
    journal = factory()
    await journal.open()
    await journal.aclose()
    schema = factory.pg_schema  # type: ignore[attr-defined]
    assert _schema_exists(schema)
    drop_scratch_schemas()  # what the autouse fixture does when a test ends
    assert not _schema_exists(schema)
