"""The Postgres journal's kept counts (migration 5): `count_calls` and `stats` without reading records.

`call_counts` holds the final records (COMPLETED, FAILED, RELEASED, CANCELLED) by principal,
tool and state, and `entry_counts` the process entries, changed in the transaction of every
change, one row per group and writing session (`shard`, its backend pid), so writers never wait
on a count. Since migration 7 the journal's own statements move the call counts
(`journal.count_moved`) and triggers count what other sessions change; the open records
(PENDING, IN_DOUBT), which a claim makes and a completion ends, are not kept but counted when
read, from the partial index that holds only them (`calls_open`): a claim writes no count.
A reader sums the rows of what it asks for; rows of sessions long gone pile up (a pool replaces
its connections), so when a read finds many more rows than groups it folds them into shard 0
(`fold`): one statement that takes only rows no transaction holds (`SKIP LOCKED`), so it never
waits for a writer, and a writer waits at most for it. The oldest record comes from the indexes
on `created_at`.

A time range is counted from the records created in it (the same indexes), grouped in SQL.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ...errors import JournalError
from ..base import CallCounts, CountQuery
from ..model import JournalStats
from ..sql_rows import OPEN_CALLS, counts_of, ranged_count_sql
from .schema import PRINCIPAL_KEY

Fetch = Callable[[str, tuple[Any, ...] | list[Any]], Awaitable[list[tuple[Any, ...]]]]
Execute = Callable[[str, tuple[Any, ...]], Awaitable[int]]

#: A read that found more than this many count rows beyond `ROWS_PER_GROUP` per group folds them.
SLACK_ROWS = 64
ROWS_PER_GROUP = 4


class KeptCounts:
    """The counting statements of one journal schema (`calls`, `entries` are its quoted tables)."""

    def __init__(self, schema: str, calls: str, entries: str, fetch: Fetch, execute: Execute) -> None:
        self._calls, self._entries, self._fetch, self._execute = calls, entries, fetch, execute
        counts, entry_counts = f"{schema}.call_counts", f"{schema}.entry_counts"
        # The final records' groups from the kept rows, and the open ones (PENDING, IN_DOUBT:
        # not kept since migration 7) counted from `calls_open`, which holds only them.
        groups = (
            "SELECT principal, tool, state, sum(n) AS n, count(*) AS rows FROM {counts} {where} GROUP BY 1, 2, 3 "
            f"UNION ALL SELECT principal, tool, state, count(*), 0 FROM {calls} WHERE {OPEN_CALLS} {{open_mine}} "
            "GROUP BY 1, 2, 3"
        )
        # One statement, so the counts and the oldest record are of one snapshot; one row (of
        # NULL groups) when nothing is counted. The oldest record is the first of an index in
        # `created_at` order (`calls_by_created`; a principal's, `calls_by_principal_created`
        # through its `PRINCIPAL_KEY`), asked as such: `min()` may be planned as a walk.
        oldest = "(SELECT created_at FROM {calls} {mine} ORDER BY created_at LIMIT 1)"
        counted = (
            f"WITH o AS (SELECT {oldest} AS oldest) "
            "SELECT g.principal, g.tool, g.state, g.n, g.rows, o.oldest "
            f"FROM o LEFT JOIN ({groups}) AS g ON true"
        )
        self._all_sql = counted.format(calls=calls, counts=counts, mine="", where="", open_mine="")
        mine, where = f"WHERE {PRINCIPAL_KEY} = %s", "WHERE principal = %s"
        self._mine_sql = counted.format(
            calls=calls, counts=counts, mine=mine, where=where, open_mine="AND principal = %s"
        )
        self._stats_sql = (
            f"WITH o AS (SELECT {oldest.format(calls=calls, mine='')} AS oldest, "
            f"(SELECT sum(n) FROM {entry_counts}) AS entries, (SELECT count(*) FROM {entry_counts}) AS entry_rows, "
            "pg_total_relation_size(%s) + pg_total_relation_size(%s) AS size) "
            "SELECT g.principal, g.tool, g.state, g.n, g.rows, o.oldest, o.entries, o.entry_rows, o.size "
            f"FROM o LEFT JOIN ({groups.format(counts=counts, where='', open_mine='')}) AS g ON true"
        )
        # Rows no transaction holds move to shard 0, summed; a group whose sum is 0 leaves none.
        self._fold_sql = (
            f"WITH moved AS (DELETE FROM {counts} WHERE ctid = ANY(ARRAY("
            f"SELECT ctid FROM {counts} WHERE shard <> 0 FOR UPDATE SKIP LOCKED)) "
            "RETURNING principal, tool, state, n) "
            f"INSERT INTO {counts} AS c (principal, tool, state, shard, n) "
            "SELECT principal, tool, state, 0, sum(n) FROM moved GROUP BY principal, tool, state "
            "HAVING sum(n) <> 0 ORDER BY principal, tool, state "
            "ON CONFLICT (principal, tool, state, shard) DO UPDATE SET n = c.n + excluded.n"
        )
        self._fold_zero_sql = f"DELETE FROM {counts} WHERE shard = 0 AND n = 0"
        self._fold_entries_sql = (
            f"WITH moved AS (DELETE FROM {entry_counts} WHERE ctid = ANY(ARRAY("
            f"SELECT ctid FROM {entry_counts} WHERE shard <> 0 FOR UPDATE SKIP LOCKED)) RETURNING n) "
            f"INSERT INTO {entry_counts} AS c (shard, n) SELECT 0, sum(n) FROM moved HAVING count(*) > 0 "
            "ON CONFLICT (shard) DO UPDATE SET n = c.n + excluded.n"
        )

    async def count(self, query: CountQuery) -> CallCounts:
        if query.ranged:
            whole = "floor({})::bigint".format
            sql, args = ranged_count_sql(query, "%s", self._calls, whole, PRINCIPAL_KEY)
            return counts_of(await self._fetch(sql, args))
        if query.principal is None:
            rows = await self._fetch(self._all_sql, ())
        else:
            rows = await self._fetch(self._mine_sql, (query.principal, query.principal, query.principal))
        await self._fold_if_spread(rows, 0)
        return counts_of(((p, t, s, None, n, None) for p, t, s, n, _, _ in rows if p is not None), rows[0][5])

    async def stats(self) -> JournalStats:
        rows = await self._fetch(self._stats_sql, (self._calls, self._entries))
        await self._fold_if_spread(rows, int(rows[0][7]))
        counts = counts_of((p, t, s, None, n, None) for p, t, s, n, *_ in rows if p is not None)
        oldest, entries, size = rows[0][5], rows[0][6], rows[0][8]
        return JournalStats("postgres", counts.by_state, counts.by_tool, int(entries or 0), int(size), oldest)

    async def _fold_if_spread(self, rows: list[tuple[Any, ...]], entry_rows: int) -> None:
        groups = [row for row in rows if row[0] is not None]
        try:
            if sum(int(row[4]) for row in groups) > ROWS_PER_GROUP * len(groups) + SLACK_ROWS:
                await self.fold()
            if entry_rows > SLACK_ROWS:
                await self._execute(self._fold_entries_sql, ())
        except JournalError:
            pass  # the counts read stand; a later read folds

    async def fold(self) -> None:
        """Sum the count rows of every session into shard 0 (those a transaction holds stay)."""
        await self._execute(self._fold_sql, ())
        await self._execute(self._fold_zero_sql, ())
