"""The Postgres journal's schema: an ordered list of migrations, applied by the journal itself.

Every replica runs `migrate()` when it opens. The whole migration runs in one transaction under
a transaction-level advisory lock named after the schema, so replicas starting at once apply
each migration exactly once (the others wait for the lock, then find nothing left to do).
`schema_version` records what was applied; a database migrated by a newer release than this
one is refused rather than written with an older idea of the tables.

To change the schema, append a `Migration` (never edit one that shipped).

Text columns use `COLLATE "C"`: listings order `(created_at, principal, tool, key)` by code
point, exactly as the other backends (Python string order) do.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import psycopg

from ...errors import JournalError
from ..base import AUDIT_PROCESS
from ..sql_rows import LEGACY_REASON_SQL

#: The setting a session that counts its own changes of `calls` carries (migration 7): the
#: journal's connections set it (`journal.py`, `_COUNTED`), and the update trigger counts
#: the changes of every other session. Shipped in that trigger: never change it.
COUNTED_SETTING = "mcp_durable.counted"
COUNTED_BY_STATEMENT = "by_statement"
NOT_COUNTED_BY_STATEMENT = f"current_setting('{COUNTED_SETTING}', true) IS DISTINCT FROM '{COUNTED_BY_STATEMENT}'"


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema change: `version` (1, 2, …), what it does, and its statements (`{s}` = schema)."""

    version: int
    description: str
    statements: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "call records, process entries, NOTIFY on call changes",
        (
            """CREATE TABLE {s}.calls (
                principal text COLLATE "C" NOT NULL, tool text COLLATE "C" NOT NULL,
                key text COLLATE "C" NOT NULL,
                fingerprint text NOT NULL, state text NOT NULL, version bigint NOT NULL,
                run_id text NOT NULL, attempts integer NOT NULL,
                created_at double precision NOT NULL, updated_at double precision NOT NULL,
                owner text, lease_until double precision, completed_at double precision,
                expires_at double precision, result bytea, error text, arguments bytea,
                PRIMARY KEY (principal, tool, key))""",
            "CREATE INDEX calls_by_created ON {s}.calls (created_at, principal, tool, key)",
            "CREATE INDEX calls_by_expiry ON {s}.calls (expires_at) WHERE expires_at IS NOT NULL",
            "CREATE INDEX calls_by_state ON {s}.calls (state, created_at)",
            """CREATE TABLE {s}.entries (
                seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                process_id text NOT NULL, entry_type text NOT NULL, data json NOT NULL,
                ts double precision NOT NULL)""",
            "CREATE INDEX entries_by_process ON {s}.entries (process_id, seq)",
            # The wake-up for waiters on other replicas: sent in the transaction that changes a
            # record, so it is delivered exactly when (and only if) the change commits. Lease
            # renewals do not change version/state and wake nobody. A payload over NOTIFY's
            # 8000-byte limit (huge keys) is sent empty: "something changed, re-read all".
            """CREATE FUNCTION {s}.notify_call_change() RETURNS trigger LANGUAGE plpgsql AS $$
            DECLARE payload text := json_build_array(NEW.principal, NEW.tool, NEW.key)::text;
            BEGIN
                IF octet_length(payload) > 7900 THEN payload := ''; END IF;
                PERFORM pg_notify(TG_ARGV[0], payload);
                RETURN NULL;
            END $$""",
            """CREATE TRIGGER calls_changed AFTER UPDATE ON {s}.calls FOR EACH ROW
            WHEN (OLD.version IS DISTINCT FROM NEW.version OR OLD.state IS DISTINCT FROM NEW.state
                  OR OLD.run_id IS DISTINCT FROM NEW.run_id)
            EXECUTE FUNCTION {s}.notify_call_change({channel})""",
        ),
    ),
    Migration(
        2,
        "NOTIFY only for records someone waits on (calls.watched)",
        (
            # NOTIFY serialises committing transactions on a database-wide lock, which cut
            # concurrent claim+complete throughput about threefold. Only a waiter needs the
            # wake-up, so a waiter marks the record `watched` (compare-and-set on the version it
            # read) and only changes of watched records notify. A fresh claim clears the mark.
            "ALTER TABLE {s}.calls ADD COLUMN watched boolean NOT NULL DEFAULT false",
            "DROP TRIGGER calls_changed ON {s}.calls",
            """CREATE TRIGGER calls_changed AFTER UPDATE ON {s}.calls FOR EACH ROW
            WHEN (OLD.watched AND (OLD.version IS DISTINCT FROM NEW.version
                  OR OLD.state IS DISTINCT FROM NEW.state OR OLD.run_id IS DISTINCT FROM NEW.run_id))
            EXECUTE FUNCTION {s}.notify_call_change({channel})""",
        ),
    ),
    Migration(
        3,
        "MCP tasks: calls.task_id, found by (principal, task_id)",
        (
            'ALTER TABLE {s}.calls ADD COLUMN task_id text COLLATE "C"',
            "CREATE INDEX calls_by_task ON {s}.calls (principal, task_id) WHERE task_id IS NOT NULL",
        ),
    ),
    Migration(
        4,
        "a typed reason (calls.reason, read from error for older rows); durable steps unique per "
        "process and index (entries.step_index)",
        (
            # Records written before: the reason their error text names (`legacy_reason`). The
            # NOTIFY trigger is not fired: version, state and run_id stay as they are.
            "ALTER TABLE {s}.calls ADD COLUMN reason text",
            "UPDATE {s}.calls SET reason = " + LEGACY_REASON_SQL + " WHERE state IN ('released', 'in_doubt')",
            # Step entries get their index (`record_json.step_index`: a JSON integer that fits 64
            # bits; the nested CASEs keep each test from seeing what the one before excluded) …
            "ALTER TABLE {s}.entries ADD COLUMN step_index bigint",
            """UPDATE {s}.entries SET step_index = CASE WHEN json_typeof(data) = 'object' THEN
                CASE WHEN json_typeof(data -> 'index') = 'number' THEN
                CASE WHEN (data ->> 'index') ~ '^-?[0-9]+$' THEN
                CASE WHEN (data ->> 'index')::numeric BETWEEN -9223372036854775808 AND 9223372036854775807
                THEN (data ->> 'index')::bigint END END END END
            WHERE entry_type = 'step'""",
            # … and where a process holds one index twice (no release refused that), the first
            # entry is the step; the later ones are kept, not as it.
            """UPDATE {s}.entries e SET step_index = NULL WHERE step_index IS NOT NULL AND EXISTS (
                SELECT 1 FROM {s}.entries f WHERE f.process_id = e.process_id AND f.step_index = e.step_index
                AND f.seq < e.seq)""",
            "CREATE UNIQUE INDEX entries_by_step ON {s}.entries (process_id, step_index) WHERE step_index IS NOT NULL",
        ),
    ),
    Migration(
        5,
        "kept counts of calls by principal, tool and state and of entries (call_counts, entry_counts); "
        "indexes for a principal's calls by time and the audit entries of a call",
        (
            # One row per group and writing session (`shard` = its backend pid; 0 holds what
            # `postgres/counts.py` folded in): a statement adds to its own session's rows, which
            # no other session writes, so concurrent writers never wait for each other or
            # deadlock on a count. A reader sums the rows.
            """CREATE TABLE {s}.call_counts (
                principal text COLLATE "C" NOT NULL, tool text COLLATE "C" NOT NULL, state text NOT NULL,
                shard integer NOT NULL, n bigint NOT NULL, PRIMARY KEY (principal, tool, state, shard))""",
            "CREATE TABLE {s}.entry_counts (shard integer PRIMARY KEY, n bigint NOT NULL)",
            # Statement triggers: one upsert per group a statement changed (a batch of 32
            # claims of one tool is one), in group order.
            """CREATE FUNCTION {s}.count_calls() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF TG_OP = 'INSERT' THEN
                    INSERT INTO {s}.call_counts AS c (principal, tool, state, shard, n)
                    SELECT principal, tool, state, pg_backend_pid(), count(*) FROM new_rows
                    GROUP BY principal, tool, state ORDER BY principal, tool, state
                    ON CONFLICT (principal, tool, state, shard) DO UPDATE SET n = c.n + excluded.n;
                ELSIF TG_OP = 'DELETE' THEN
                    INSERT INTO {s}.call_counts AS c (principal, tool, state, shard, n)
                    SELECT principal, tool, state, pg_backend_pid(), -count(*) FROM old_rows
                    GROUP BY principal, tool, state ORDER BY principal, tool, state
                    ON CONFLICT (principal, tool, state, shard) DO UPDATE SET n = c.n + excluded.n;
                ELSE
                    INSERT INTO {s}.call_counts AS c (principal, tool, state, shard, n)
                    SELECT principal, tool, state, pg_backend_pid(), sum(d) FROM (
                        SELECT principal, tool, state, 1 AS d FROM new_rows
                        UNION ALL SELECT principal, tool, state, -1 FROM old_rows) AS moved
                    GROUP BY principal, tool, state HAVING sum(d) <> 0 ORDER BY principal, tool, state
                    ON CONFLICT (principal, tool, state, shard) DO UPDATE SET n = c.n + excluded.n;
                END IF;
                RETURN NULL;
            END $$""",
            "CREATE TRIGGER calls_counted_insert AFTER INSERT ON {s}.calls REFERENCING NEW TABLE AS new_rows "
            "FOR EACH STATEMENT EXECUTE FUNCTION {s}.count_calls()",
            "CREATE TRIGGER calls_counted_update AFTER UPDATE ON {s}.calls REFERENCING OLD TABLE AS old_rows "
            "NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {s}.count_calls()",
            "CREATE TRIGGER calls_counted_delete AFTER DELETE ON {s}.calls REFERENCING OLD TABLE AS old_rows "
            "FOR EACH STATEMENT EXECUTE FUNCTION {s}.count_calls()",
            """CREATE FUNCTION {s}.count_entries() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF TG_OP = 'INSERT' THEN
                    INSERT INTO {s}.entry_counts AS c (shard, n) SELECT pg_backend_pid(), count(*) FROM new_rows
                    HAVING count(*) > 0 ON CONFLICT (shard) DO UPDATE SET n = c.n + excluded.n;
                ELSE
                    INSERT INTO {s}.entry_counts AS c (shard, n) SELECT pg_backend_pid(), -count(*) FROM old_rows
                    HAVING count(*) > 0 ON CONFLICT (shard) DO UPDATE SET n = c.n + excluded.n;
                END IF;
                RETURN NULL;
            END $$""",
            "CREATE TRIGGER entries_counted_insert AFTER INSERT ON {s}.entries REFERENCING NEW TABLE AS new_rows "
            "FOR EACH STATEMENT EXECUTE FUNCTION {s}.count_entries()",
            "CREATE TRIGGER entries_counted_delete AFTER DELETE ON {s}.entries REFERENCING OLD TABLE AS old_rows "
            "FOR EACH STATEMENT EXECUTE FUNCTION {s}.count_entries()",
            # What stands now, counted after the triggers exist: they lock the tables against
            # writers (of any release) until this migration commits, so nothing is missed or
            # counted twice.
            "INSERT INTO {s}.call_counts SELECT principal, tool, state, 0, count(*) FROM {s}.calls "
            "GROUP BY principal, tool, state",
            "INSERT INTO {s}.entry_counts SELECT 0, count(*) FROM {s}.entries",
            # On an expression (`PRINCIPAL_KEY`) that only the counting queries name: an index
            # led by the plain `principal` was chosen by the planner for the batch statements'
            # key lookups on a small table (over `calls_pkey`), and a session keeps such a plan
            # as the table grows.
            "CREATE INDEX calls_by_principal_created ON {s}.calls ((principal || ''), created_at)",
            "CREATE INDEX entries_by_audit ON {s}.entries ((data ->> 'principal'), (data ->> 'tool'), "
            f"(data ->> 'key'), seq) WHERE process_id = '{AUDIT_PROCESS}'",
        ),
    ),
    Migration(
        6,
        "the PENDING and IN_DOUBT records in an index of their own (calls_open), in place of calls_by_state",
        (
            # Only open records (`sql_rows.OPEN_CALLS`, which the listings of those states name):
            # the sweep, the task watch, recovery and the in-doubt listings read it in listing
            # order, no sort, `task_id` decided on the index entry. A completion, which leaves
            # it, adds no entry to it; `calls_by_state` took one for every change of state, and
            # served only these listings.
            "CREATE INDEX calls_open ON {s}.calls (state, created_at, principal, tool, key, task_id) "
            "WHERE state IN ('pending', 'in_doubt')",
            "DROP INDEX {s}.calls_by_state",
        ),
    ),
    Migration(
        7,
        "kept counts of final records only, written by the journal's own statements; open records "
        "counted from calls_open; row triggers count only what other sessions change",
        (
            # Why (docs/benchmarks.md, "Kept counts on Postgres without statement triggers"): a
            # statement trigger with transition tables copied every changed row and ran a
            # grouped upsert through SPI in every claim and completion, a replay's claim
            # included; a sequential miss paid two of them. Now a claim writes no count at all
            # (PENDING and IN_DOUBT records, few and in `calls_open`, are counted when read), and
            # a change into or out of a final state is counted by the statement that makes it
            # (`journal.count_moved`), in the same transaction. A session that says so
            # (`COUNTED_SETTING`: the journal's own connections) is trusted to; any other writer
            # (an operator's SQL, a tool of our own) is still counted, row by row.
            "DROP TRIGGER calls_counted_insert ON {s}.calls",
            "DROP TRIGGER calls_counted_update ON {s}.calls",
            "DROP TRIGGER calls_counted_delete ON {s}.calls",
            """CREATE FUNCTION {s}.count_final_call() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF TG_OP <> 'INSERT' AND OLD.state NOT IN ('pending', 'in_doubt') THEN
                    INSERT INTO {s}.call_counts AS c (principal, tool, state, shard, n)
                    VALUES (OLD.principal, OLD.tool, OLD.state, pg_backend_pid(), -1)
                    ON CONFLICT (principal, tool, state, shard) DO UPDATE SET n = c.n + excluded.n;
                END IF;
                IF TG_OP <> 'DELETE' AND NEW.state NOT IN ('pending', 'in_doubt') THEN
                    INSERT INTO {s}.call_counts AS c (principal, tool, state, shard, n)
                    VALUES (NEW.principal, NEW.tool, NEW.state, pg_backend_pid(), 1)
                    ON CONFLICT (principal, tool, state, shard) DO UPDATE SET n = c.n + excluded.n;
                END IF;
                RETURN NULL;
            END $$""",
            """CREATE FUNCTION {s}.count_final_calls_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO {s}.call_counts AS c (principal, tool, state, shard, n)
                SELECT principal, tool, state, pg_backend_pid(), -count(*) FROM old_rows
                WHERE state NOT IN ('pending', 'in_doubt')
                GROUP BY principal, tool, state ORDER BY principal, tool, state
                ON CONFLICT (principal, tool, state, shard) DO UPDATE SET n = c.n + excluded.n;
                RETURN NULL;
            END $$""",
            # Inserted final records (an import): from every session; a claim inserts an open one.
            "CREATE TRIGGER calls_counted_insert AFTER INSERT ON {s}.calls FOR EACH ROW "
            "WHEN (NEW.state NOT IN ('pending', 'in_doubt')) EXECUTE FUNCTION {s}.count_final_call()",
            # Changes of other sessions only: the journal's statements count their own.
            "CREATE TRIGGER calls_counted_update AFTER UPDATE ON {s}.calls FOR EACH ROW "
            "WHEN ((OLD.principal, OLD.tool, OLD.state) IS DISTINCT FROM (NEW.principal, NEW.tool, NEW.state) "
            "AND (OLD.state NOT IN ('pending', 'in_doubt') OR NEW.state NOT IN ('pending', 'in_doubt')) "
            f"AND {NOT_COUNTED_BY_STATEMENT}) EXECUTE FUNCTION {{s}}.count_final_call()",
            # Deletes (retention: many rows a statement) from every session, one upsert per group.
            "CREATE TRIGGER calls_counted_delete AFTER DELETE ON {s}.calls REFERENCING OLD TABLE AS old_rows "
            "FOR EACH STATEMENT EXECUTE FUNCTION {s}.count_final_calls_deleted()",
            "DROP FUNCTION {s}.count_calls()",
            "DELETE FROM {s}.call_counts WHERE state IN ('pending', 'in_doubt')",
        ),
    ),
)

LATEST = MIGRATIONS[-1].version
#: What `calls_by_principal_created` indexes of a record's principal (migration 5): queries that
#: read a principal's records by time say it so, to use that index.
PRINCIPAL_KEY = "(principal || '')"


def quote_ident(name: str) -> str:
    """A double-quoted identifier (names are validated by `PostgresSettings` already)."""
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


#: How long a migration waits for its tables' lock before it lets go and tries again
#: (`migrate`): well under Postgres's `deadlock_timeout` (1 s unless set lower), so when a
#: replica of an earlier release holds one of the tables and waits for the other, the
#: migration steps back before the deadlock check aborts either side.
MIGRATION_LOCK_TIMEOUT_MS = 100
#: How long `migrate` keeps trying for that lock before it gives up (`JournalError`).
MIGRATION_LOCK_PATIENCE = 60.0


async def migrate(conn: psycopg.AsyncConnection[tuple[object, ...]], schema: str, channel: str) -> list[int]:
    """Bring `schema` up to `LATEST`; returns the versions applied now (empty: already current).

    A schema that has tables and is behind is locked first, whole (`calls` and `entries`,
    ACCESS EXCLUSIVE), before any migration statement runs: replicas of the earlier release
    keep working during a rolling upgrade, and their statements take weaker locks on those
    tables one after another. A migration that took its locks as its statements came (an
    index build's SHARE, then a DROP INDEX's ACCESS EXCLUSIVE) could hold one such replica
    back while waiting for it: Postgres broke that deadlock by aborting the migration (the
    newer replica failed to start) or the older replica's statement. Taken first, the lock
    waits for the transactions in flight and holds nothing they need; while it waits, the
    other side goes first (a lock wait of `MIGRATION_LOCK_TIMEOUT_MS`, then a new attempt).
    """
    deadline = time.monotonic() + MIGRATION_LOCK_PATIENCE
    pause = 0.01
    while True:
        try:
            return await _migrate_once(conn, schema, channel)
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected) as exc:
            if time.monotonic() >= deadline:
                raise JournalError(
                    f"cannot migrate postgres journal schema {schema!r}: its tables stayed locked by other "
                    f"sessions for {MIGRATION_LOCK_PATIENCE:g} s"
                ) from exc
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.5)


async def _migrate_once(conn: psycopg.AsyncConnection[tuple[object, ...]], schema: str, channel: str) -> list[int]:
    """One attempt of `migrate`, in one transaction (rolled back whole when it fails)."""
    s = quote_ident(schema)
    applied: list[int] = []
    async with conn.transaction():
        # No statement timeout here (the connection's is a guard for calls, seconds): a
        # migration builds indexes over and counts every record, which takes longer on a large
        # journal (docs/deployment.md, "Upgrades"), and a replica starting beside the one that
        # migrates waits for it at the lock below. Both end: the work is bounded, and the lock
        # is let go when the migrating session ends, however it ends.
        await conn.execute("SET LOCAL statement_timeout = 0")
        # Serialise replicas migrating the same schema; released at commit.
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"mcp_durable.migrate.{schema}",))
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {s}.schema_version (version integer PRIMARY KEY, "
            "description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        cur = await conn.execute(f"SELECT coalesce(max(version), 0) FROM {s}.schema_version")
        row = await cur.fetchone()
        current = int(row[0]) if row else 0  # type: ignore[call-overload]
        if current > LATEST:
            raise JournalError(
                f"journal schema {schema!r} is at version {current}, newer than this mcp-durable "
                f"understands ({LATEST}): upgrade mcp-durable on every replica"
            )
        if 0 < current < LATEST:  # migration 1 made both tables
            await conn.execute(f"SET LOCAL lock_timeout = {MIGRATION_LOCK_TIMEOUT_MS}")
            await conn.execute(f"LOCK TABLE {s}.calls, {s}.entries IN ACCESS EXCLUSIVE MODE")
            await conn.execute("SET LOCAL lock_timeout = DEFAULT")
        for migration in MIGRATIONS:
            if migration.version <= current:
                continue
            for statement in migration.statements:
                await conn.execute(statement.format(s=s, channel=quote_literal(channel)))
            await conn.execute(
                f"INSERT INTO {s}.schema_version (version, description) VALUES (%s, %s)",
                (migration.version, migration.description),
            )
            applied.append(migration.version)
    return applied
