"""What only the Postgres journal has: migrations, several journals on one schema, NOTIFY
wake-ups across connections, URLs, and recovery from connections the server dropped.

Every test runs on its own schema of the test database (`postgres_or_skip()`: skipped without
a server, failed under CI).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator

import anyio
import orjson
import psycopg
import pytest

from mcp_durable.errors import ConfigError, JournalError
from mcp_durable.journal import CallIdentity, CallQuery, CallRecord, CallState, create_journal
from mcp_durable.journal.postgres import PostgresJournal, PostgresSettings
from mcp_durable.journal.postgres import lane as lane_module
from mcp_durable.journal.postgres.schema import LATEST, MIGRATIONS
from tests.backends.pg_cluster import scratch_schema
from tests.conftest import postgres_or_skip

pytestmark = pytest.mark.postgres

T0 = 1_700_000_000.0


def pending(key: str = "k", owner: str = "A") -> CallRecord:
    return CallRecord(
        identity=CallIdentity("local", "refund", key),
        fingerprint="f",
        state=CallState.PENDING,
        version=1,
        run_id=f"run-{key}",
        attempts=1,
        created_at=T0,
        updated_at=T0,
        owner=owner,
        lease_until=T0 + 30,
    )


@pytest.fixture
def schema_url() -> Iterator[str]:
    with scratch_schema() as url:
        yield url


async def claim_and_complete(journal: PostgresJournal, key: str) -> CallRecord:
    """Claim a new call under `key` (it must win) and complete it; the claimed record."""
    won, claimed = await journal.claim(pending(key), T0)
    assert won
    done = claimed.evolve(state=CallState.COMPLETED, owner=None, lease_until=None, result=b"{}")
    assert await journal.swap(claimed.version, done)
    return claimed


def pool_checkouts(journal: PostgresJournal) -> int:
    """Connections taken from the journal's pool so far."""
    assert journal._pool is not None
    return int(journal._pool.get_stats().get("requests_num", 0))


async def opened(url: str) -> PostgresJournal:
    journal = create_journal(url)
    assert isinstance(journal, PostgresJournal)
    await journal.open()
    return journal


@pytest.fixture
async def pair(schema_url: str) -> AsyncIterator[tuple[PostgresJournal, PostgresJournal]]:
    """Two journals on one schema, each with its own pool and LISTEN connection: two replicas."""
    first, second = await opened(schema_url), await opened(schema_url)
    try:
        yield first, second
    finally:
        await first.aclose()
        await second.aclose()


def test_our_query_parameters_are_stripped_before_libpq_sees_the_url() -> None:
    s = PostgresSettings.from_url(
        "postgresql://u:p@db:5433/app?schema=tenant_1&pool_max=32&sslmode=disable&pool_timeout=2.5&poll=3"
    )
    assert (s.schema, s.pool_max, s.pool_timeout, s.poll) == ("tenant_1", 32, 2.5, 3.0)
    keepalives = "keepalives=1&keepalives_idle=10&keepalives_interval=5&keepalives_count=3"
    assert s.conninfo == f"postgresql://u:p@db:5433/app?sslmode=disable&connect_timeout=5&{keepalives}"
    assert s.channel == "mcp_durable.tenant_1"
    given = "postgres://h/db?connect_timeout=1&keepalives=0&options=-c%20search_path%3Dx"
    added = "&keepalives_idle=10&keepalives_interval=5&keepalives_count=3"
    assert PostgresSettings.from_url(given).conninfo == given + added


@pytest.mark.parametrize(
    "query", ["schema=1bad", "schema=a;drop", "schema=" + "x" * 49, "pool_max=0", "pool_min=5&pool_max=2", "poll=x"]
)
def test_a_bad_url_parameter_is_a_config_error(query: str) -> None:
    with pytest.raises(ConfigError):
        create_journal(f"postgresql://127.0.0.1/test?{query}")


def test_a_missing_driver_names_the_pip_command() -> None:
    code = (
        "import sys; sys.modules['psycopg'] = None\n"
        "from mcp_durable.errors import ConfigError\n"
        "from mcp_durable.journal import create_journal\n"
        "try:\n    create_journal('postgresql://127.0.0.1/test')\n"
        "except ConfigError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'mcp-durable[postgres]'" in out


async def test_replicas_opening_at_once_apply_each_migration_exactly_once(schema_url: str) -> None:
    journals = [create_journal(schema_url) for _ in range(5)]
    async with anyio.create_task_group() as tg:
        for journal in journals:
            tg.start_soon(journal.open)
    try:
        applied = [j.migrations_applied for j in journals if isinstance(j, PostgresJournal) and j.migrations_applied]
        assert applied == [list(range(1, LATEST + 1))]  # one replica migrated; the others found it current
        schema = PostgresSettings.from_url(schema_url).schema
        with psycopg.connect(postgres_or_skip()) as conn:
            rows = conn.execute(f'SELECT version FROM "{schema}".schema_version ORDER BY version').fetchall()
        assert [r[0] for r in rows] == [m.version for m in MIGRATIONS]
    finally:
        for journal in journals:
            await journal.aclose()


async def test_a_schema_migrated_by_a_newer_release_is_refused(schema_url: str) -> None:
    journal = await opened(schema_url)
    await journal.aclose()
    schema = PostgresSettings.from_url(schema_url).schema
    with psycopg.connect(postgres_or_skip(), autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{schema}".schema_version (version, description) VALUES (%s, %s)',
            (LATEST + 1, "from the future"),
        )
    with pytest.raises(JournalError, match="newer"):
        await opened(schema_url)


async def test_of_claims_spread_over_three_journals_exactly_one_wins(schema_url: str) -> None:
    journals = [await opened(schema_url) for _ in range(3)]
    winners: list[str] = []

    async def claim(i: int) -> None:
        won, _ = await journals[i % 3].claim(pending(owner=f"owner-{i}"), T0)
        if won:
            winners.append(f"owner-{i}")

    try:
        async with anyio.create_task_group() as tg:
            for i in range(60):
                tg.start_soon(claim, i)
        assert len(winners) == 1
        for journal in journals:
            stored = await journal.get(CallIdentity("local", "refund", "k"))
            assert stored is not None and stored.owner == winners[0]
    finally:
        for journal in journals:
            await journal.aclose()


async def test_a_waiter_on_one_replica_is_woken_by_notify_from_another(schema_url: str) -> None:
    # The waiter's fallback re-read is 60 s away: only the NOTIFY can wake it within the 20 s wait.
    slow_poll = await opened(schema_url + "&poll=60")
    writer = await opened(schema_url)
    try:
        _, record = await writer.claim(pending(), T0)
        assert await slow_poll.get(record.identity) is not None

        async def complete_soon() -> None:
            await anyio.sleep(0.2)
            assert await writer.swap(1, record.evolve(state=CallState.COMPLETED, result=b"{}"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(complete_soon)
            with anyio.move_on_after(20) as waited:
                while True:
                    await slow_poll.wait_for_change(record.identity, 20)
                    current = await slow_poll.get(record.identity)
                    if current is not None and current.state == CallState.COMPLETED:
                        break
        assert not waited.cancelled_caught, "the waiter was not woken by the other journal's change"
    finally:
        await slow_poll.aclose()
        await writer.aclose()


async def test_only_changes_of_a_watched_record_notify_and_a_lease_renewal_does_not(
    pair: tuple[PostgresJournal, PostgresJournal],
) -> None:
    first, second = pair
    _, watched = await first.claim(pending("watched"), T0)
    _, quiet = await first.claim(pending("quiet"), T0)
    _, marker = await first.claim(pending("marker"), T0)
    for record in (watched, marker):  # a waiter on the second replica reads, then waits
        assert await second.get(record.identity) is not None
        await second.wait_for_change(record.identity, 0.01)
    payloads: list[str] = []
    listener = second._listener
    assert listener is not None
    original = listener._on_message

    def spy(payload: str) -> None:
        payloads.append(payload)
        original(payload)

    listener._on_message = spy
    assert watched.fence is not None
    await first.renew(watched.identity, watched.fence, T0 + 60)
    await first.swap(1, watched.evolve(state=CallState.IN_DOUBT))
    await first.swap(1, quiet.evolve(state=CallState.IN_DOUBT))  # nobody waits on it: no NOTIFY
    # A last change: NOTIFYs arrive in commit order, so once it is here every notification of
    # the renewal and the swaps before it would be here too.
    await first.swap(1, marker.evolve(state=CallState.IN_DOUBT))
    with anyio.fail_after(10):
        while len(payloads) < 2:
            await anyio.sleep(0.01)
    assert [orjson.loads(p) for p in payloads] == [["local", "refund", "watched"], ["local", "refund", "marker"]]


async def test_a_wait_on_a_record_that_changed_since_it_was_read_returns_at_once(schema_url: str) -> None:
    first, second = await opened(schema_url), await opened(schema_url + "&poll=60")
    try:
        _, record = await first.claim(pending(), T0)
        assert await second.get(record.identity) is not None  # reads version 1 …
        await first.swap(1, record.evolve(state=CallState.COMPLETED))  # … which changes, unwatched
        with anyio.move_on_after(20) as waited:
            await second.wait_for_change(record.identity, 60)  # the mark finds version 2: no wait
        assert not waited.cancelled_caught
    finally:
        await first.aclose()
        await second.aclose()


async def test_a_schema_at_an_older_version_is_migrated_and_keeps_its_records(schema_url: str) -> None:
    settings = PostgresSettings.from_url(schema_url)
    s = f'"{settings.schema}"'
    with psycopg.connect(postgres_or_skip(), autocommit=True) as conn:  # what release 1 created
        conn.execute(f"CREATE SCHEMA {s}")
        conn.execute(
            f"CREATE TABLE {s}.schema_version (version integer PRIMARY KEY, description text NOT NULL, "
            "applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for statement in MIGRATIONS[0].statements:
            conn.execute(statement.format(s=s, channel=f"'{settings.channel}'"))
        conn.execute(f"INSERT INTO {s}.schema_version (version, description) VALUES (1, 'v1')")
        conn.execute(
            f"INSERT INTO {s}.calls (principal, tool, key, fingerprint, state, version, run_id, attempts, "
            "created_at, updated_at) "
            "VALUES ('local', 'refund', 'old', 'f', 'completed', 2, 'r', 1, 1, 1)"
        )
    journal = await opened(schema_url)
    try:
        assert journal.migrations_applied == list(range(2, LATEST + 1))
        old = await journal.get(CallIdentity("local", "refund", "old"))
        assert old is not None and old.state == CallState.COMPLETED and old.version == 2
    finally:
        await journal.aclose()
    with psycopg.connect(postgres_or_skip()) as conn:
        rows = conn.execute(f"SELECT version FROM {s}.schema_version ORDER BY version").fetchall()
    assert [r[0] for r in rows] == list(range(1, LATEST + 1))


async def test_connections_the_server_drops_give_journal_errors_then_recover(schema_url: str) -> None:
    app = f"mcpd_{uuid.uuid4().hex[:10]}"
    journal = await opened(f"{schema_url}&pool_min=3&application_name={app}")
    try:
        _, record = await journal.claim(pending(), T0)
        listener = journal._listener
        assert listener is not None and listener.connections == 1
        with psycopg.connect(postgres_or_skip(), autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s", (app,)
            ).fetchone()
        assert killed is not None and killed[0] >= 2  # the pool's connections and the LISTEN one
        errors: list[BaseException] = []
        with anyio.fail_after(30):
            while True:
                try:
                    stored = await journal.get(record.identity)
                    break
                except Exception as exc:  # noqa: BLE001 - collected and checked below
                    errors.append(exc)
                    await anyio.sleep(0.05)
            while listener.connections < 2:
                await anyio.sleep(0.05)
        assert stored is not None and stored.owner == "A"
        assert all(isinstance(e, JournalError) for e in errors), errors
        assert listener.connected
    finally:
        await journal.aclose()


async def test_claims_and_completions_made_one_at_a_time_share_one_kept_connection(schema_url: str) -> None:
    """`lane.py`: the journal keeps its connections between statements instead of a pool
    checkout each; a lone caller's claims and completions all run on the one most recently used
    (one warm backend); and it gives them back when the journal closes (none stays open)."""
    app = f"mcpd_{uuid.uuid4().hex[:10]}"
    journal = await opened(f"{schema_url}&application_name={app}")
    try:
        before = pool_checkouts(journal)
        for n in range(20):
            await claim_and_complete(journal, f"k{n}")
        taken = pool_checkouts(journal) - before
        assert taken == 1, taken  # one for claims and completions alike (was 2, one per kind; 40 before lanes)
        stored = await journal.get(CallIdentity("local", "refund", "k19"))
        assert stored is not None and stored.state == CallState.COMPLETED
    finally:
        await journal.aclose()
    with psycopg.connect(postgres_or_skip(), autocommit=True) as admin, anyio.fail_after(10):
        while True:
            row = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)).fetchone()
            if row is not None and row[0] == 0:
                break
            await anyio.sleep(0.05)


async def test_a_lane_held_past_its_time_goes_back_to_the_pool_and_the_next_statement_takes_another(
    schema_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What happens every `HOLD_S` seconds in a long-running server, made to happen every statement."""
    monkeypatch.setattr(lane_module, "HOLD_S", 0.0)
    journal = await opened(schema_url)
    try:
        before = pool_checkouts(journal)
        for n in range(5):
            await claim_and_complete(journal, f"k{n}")
        assert pool_checkouts(journal) - before >= 10  # one checkout per statement
        assert all(lane.conn is None for lane in journal._lanes)
        stored = await journal.get(CallIdentity("local", "refund", "k4"))
        assert stored is not None and stored.state == CallState.COMPLETED
    finally:
        await journal.aclose()


async def test_a_pool_of_one_connection_still_serves_claims_completions_and_reads(schema_url: str) -> None:
    """Below `LANES_MIN_POOL` no batcher keeps a connection: with `pool_max=1` a lane holding the
    only one would leave the completions waiting for the pool until `pool_timeout`."""
    journal = await opened(f"{schema_url}&pool_min=1&pool_max=1&pool_timeout=1")
    try:
        with anyio.fail_after(10):
            for n in range(5):
                claimed = await claim_and_complete(journal, f"k{n}")
                stored = await journal.get(claimed.identity)
                assert stored is not None and stored.state == CallState.COMPLETED
                assert await journal.list_calls(CallQuery(limit=10))
    finally:
        await journal.aclose()


async def test_the_statement_timeout_joins_the_options_the_url_gives(schema_url: str) -> None:
    journal = await opened(schema_url + "&statement_timeout=0.5&options=-c%20application_name%3Dmcpd_opts")
    try:
        async with journal._connection() as conn:
            cur = await conn.execute("SELECT current_setting('statement_timeout'), current_setting('application_name')")
            assert await cur.fetchone() == ("500ms", "mcpd_opts")
            with pytest.raises(psycopg.errors.QueryCanceled):
                await conn.execute("SELECT pg_sleep(3)")
    finally:
        await journal.aclose()


async def test_an_unreachable_database_fails_open_with_a_journal_error() -> None:
    with anyio.fail_after(30):
        with pytest.raises(JournalError):
            await opened("postgresql://postgres@127.0.0.1:1/test?connect_timeout=2&pool_timeout=2")


@pytest.mark.skipif(not os.environ.get("MCP_DURABLE_PG_BIG"), reason="set MCP_DURABLE_PG_BIG=1")
async def test_many_records_list_in_pages(schema_url: str) -> None:  # pragma: no cover - opt-in volume check
    journal = await opened(schema_url)
    try:
        for i in range(5000):
            await journal.claim(pending(f"k{i:05d}"), T0)
        assert len(await journal.list_calls(CallQuery(limit=10_000))) == 5000
    finally:
        await journal.aclose()
