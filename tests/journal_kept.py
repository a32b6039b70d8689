"""Whether what a journal keeps beside its records agrees with them, read through its public API.

    from tests.journal_kept import kept_disagreements

    assert await kept_disagreements(journal) == []
    assert await kept_disagreements_at(url) == []  # a journal of its own, opened and closed

Each backend answers `count_calls`, a listing of an open state (PENDING, IN_DOUBT) and a listing
of tasks from what it keeps for them (counts, open sets and indexes, count rows), not by reading
every record. `kept_disagreements` reads every record page by page and says, one line each,
where those answers differ from the records: the counts without a range (with the oldest record),
the counts of a range in buckets (the ranged path), and the open and task listings. Used by the
engine interleavings (invariant 9), the power-loss checker (after recovery) and the SIGKILL tests
of SQLite and of Postgres replicas; the journal must not change while it reads.
"""

from __future__ import annotations

from collections.abc import Iterable

from mcp_durable.journal import CallQuery, CallRecord, Journal, create_journal
from mcp_durable.journal.base import ALL_CALLS, OPEN_STATES, CountQuery, each_call

#: The width of the buckets the ranged count uses (seconds).
BUCKET_S = 7.0
#: Records read per page.
PAGE = 500


async def kept_disagreements(journal: Journal) -> list[str]:
    """Where `journal`'s counts and open and task listings disagree with its records (empty: nowhere)."""
    records = await _all(journal, CallQuery(limit=PAGE))
    # A range from the oldest record to just before the newest, in buckets: the ranged path (a
    # walk of the runs or rows in the range), not the kept counts.
    created = sorted(r.created_at for r in records)
    since, until = (created[0], created[-1]) if created else (0.0, None)
    found = []
    for query in (ALL_CALLS, CountQuery(since=since, until=until, bucket_s=BUCKET_S)):
        counts, expected = await journal.count_calls(query), query.count(records)
        if counts != expected:
            found.append(f"count_calls({query}) answered {counts}, the records count {expected}")
    for state in sorted(OPEN_STATES):  # each listed from an index of its own
        got = _names(await _all(journal, CallQuery(state=state, limit=PAGE)))
        want = _names(r for r in records if r.state == state)
        if got != want:
            found.append(f"the listing of {state.value} records holds {got}, the records say {want}")
    got = _names(await _all(journal, CallQuery(tasks_only=True, limit=PAGE)))
    want = _names(r for r in records if r.task_id is not None)
    if got != want:
        found.append(f"the listing of tasks holds {got}, the records say {want}")
    return found


async def kept_disagreements_at(url: str) -> list[str]:
    """`kept_disagreements` of the journal at `url`, opened for it and closed after (what a test
    reads after the processes that wrote it are gone)."""
    journal = create_journal(url)
    await journal.open()
    try:
        return await kept_disagreements(journal)
    finally:
        await journal.aclose()


async def _all(journal: Journal, query: CallQuery) -> list[CallRecord]:
    return [record async for record in each_call(journal, query)]


def _names(records: Iterable[CallRecord]) -> list[tuple[str, str, str]]:
    """The identities of `records`, sorted, each once per time it is given."""
    return sorted((r.identity.principal, r.identity.tool, r.identity.key) for r in records)
