"""Shared fixtures: a `journal_factory` parametrized over every backend.

`journal_factory()` builds a new, unopened journal on the same storage each time it is called,
so a test can close one and reopen the same journal. Postgres runs against
`$MCP_DURABLE_TEST_PG` (default the machine's server); it skips when no server answers, and
fails instead when `CI` is set, so a broken backend is never hidden by a skip in CI.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from mcp_durable.journal import Journal, create_journal

PG_URL = os.environ.get("MCP_DURABLE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")

JournalFactory = Callable[[], Journal]


def _backend_available(kind: str) -> bool:
    if kind == "file":
        try:
            import mcp_durable.journal.file  # noqa: F401
        except ImportError:
            return False
    if kind == "postgres":
        try:
            import mcp_durable.journal.postgres  # noqa: F401
        except ImportError:
            return False
    return True


def postgres_or_skip() -> str:
    """The test Postgres URL; skip (or fail under CI) when no server answers."""
    try:
        import psycopg

        with psycopg.connect(PG_URL, connect_timeout=3):
            pass
    except Exception as exc:  # noqa: BLE001
        if os.environ.get("CI"):
            pytest.fail(f"Postgres at {PG_URL} is required in CI: {exc}")
        pytest.skip(f"no Postgres at {PG_URL}: {exc}")
    return PG_URL


#: Schemas `scratch_postgres_url` made for the running test; dropped when it ends (only these:
#: another test session may be using the same database at the same time).
_SCRATCH_SCHEMAS: list[str] = []


def scratch_postgres_schema(prefix: str = "t") -> str:
    """A fresh schema name `PREFIX_<random>` on the test Postgres, dropped after the test."""
    postgres_or_skip()
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    _SCRATCH_SCHEMAS.append(schema)
    return schema


def scratch_postgres_url(prefix: str = "t") -> str:
    """The test Postgres URL with a fresh `?schema=PREFIX_<random>`, dropped after the test."""
    return schema_url(scratch_postgres_schema(prefix))


def schema_url(schema: str) -> str:
    """The test Postgres URL with `?schema=SCHEMA`."""
    return f"{PG_URL}{'&' if '?' in PG_URL else '?'}schema={schema}"


@pytest.fixture(autouse=True)
def _drop_scratch_schemas() -> Iterator[None]:
    yield
    drop_scratch_schemas()


def drop_scratch_schemas() -> None:
    """Drop the schemas `scratch_postgres_url` made so far (a test making many drops them as it goes)."""
    if not _SCRATCH_SCHEMAS:
        return
    schemas = list(_SCRATCH_SCHEMAS)
    _SCRATCH_SCHEMAS.clear()
    try:
        import psycopg

        with psycopg.connect(PG_URL, autocommit=True, connect_timeout=3) as conn:
            conn.execute("SET lock_timeout = '5s'")  # a server still connected must not hang the run
            for schema in schemas:
                try:  # one schema still locked does not keep the others
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                except psycopg.errors.LockNotAvailable:
                    pass
    except Exception:  # noqa: BLE001 - cleanup only: a schema left behind fails nothing
        pass


def make_journal_factory(kind: str, tmp_path: Path) -> JournalFactory:
    if kind == "memory":
        shared = create_journal("memory://")
        return lambda: shared  # one process: "reopening" is the same store
    if kind == "sqlite":
        return lambda: create_journal(f"sqlite:///{tmp_path}/journal.db")
    if kind == "file":
        return lambda: create_journal(f"file://{tmp_path}/journal")
    if kind == "postgres":
        # A scratch schema: dropped when the test ends, whoever called this (a fixture or a
        # test body: one made here and never dropped was left behind by every suite run).
        schema = scratch_postgres_schema()
        url = schema_url(schema)

        def postgres_factory() -> Journal:
            return create_journal(url)

        postgres_factory.pg_schema = schema  # type: ignore[attr-defined]
        return postgres_factory
    raise ValueError(kind)


BACKENDS = ["memory", "sqlite", "file", "postgres"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    if not _backend_available(kind):
        if os.environ.get("CI") and kind == "postgres":
            pytest.fail("the Postgres journal is required in CI")
        pytest.skip(f"the {kind} journal is not built yet")
    return kind


@pytest.fixture
def journal_factory(backend: str, tmp_path: Path) -> JournalFactory:
    return make_journal_factory(backend, tmp_path)


@pytest.fixture
async def journal(journal_factory: JournalFactory) -> AsyncIterator[Journal]:
    store = journal_factory()
    await store.open()
    try:
        yield store
    finally:
        await store.aclose()


@pytest.fixture
def replicas_journal() -> Iterator[str]:
    """The test database with a fresh schema: the replicas of one test share it, no one else."""
    from tests.backends.pg_cluster import scratch_schema

    with scratch_schema() as url:
        yield url
