"""Retention that runs itself: expired records, their durable steps and old lifecycle entries, on a schedule.

Records carry their own expiry (`ToolPolicy.retention`); nothing removed them but an operator's
`purge`/`compact`. A server with a `RetentionSchedule` (the default; `retention_schedule=None`
turns it off) runs `retention_pass` every `interval` seconds (the first one interval after start):

1. and 2. expired records are purged with the durable-step entries (`steps/<run_id>`) of their
   runs (an expired record's run never resumes: a new call with its key claims a new run), by
   `Journal.purge_expired_calls`, which finds them through an index of expiries and drops both
   at once: a pass reads no record that has not expired. In pages, earliest expiries first:
   a page holds the journal's writer (SQLite's one connection, the file journal's event loop)
   while it deletes, so each is sized to take about `purge_page_s` (scaled from how long the
   full page before it held the writer, where the journal says (`PurgedCalls.held_s`), else
   from the time it took; never below `MIN_PAGE` records), and the pass then waits as long as
   the page took before the next one: calls made meanwhile wait for at most one page, and the writer is theirs at
   least half of the time however many records expired. A page that drops fewer records than
   it asked for was the last (nothing expired at the pass's start is left, but records another
   transaction held on Postgres, which the next pass takes). A background schedule starts each
   pass at the page size the one before settled on (`PurgePages`), so passes that each find
   about as many expired records as the last take one page each, not a ramp from `MIN_PAGE`
   (every page is a commit that a call may wait behind);
3. the server's own lifecycle process and the redaction process are checkpointed, and their
   entries before that checkpoint dropped (a checkpoint holds their whole state);
4. the file journal compacts online when its garbage (bytes of segments not held by a live
   record or entry) reaches `compact_garbage_ratio` of its segments and they hold at least
   `compact_min_bytes`: compaction copies the sealed segments' live frames in a worker thread
   while writers go on appending (journal/file/compaction.py), so serving does not pause.
   SQLite and Postgres reuse the space of deleted rows themselves.

Operator audit entries are kept. What each pass reclaimed, and when, is kept in
`RetentionReport` and shown by `journal://stats` (`maintenance.retention`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio

from ..engine import Engine
from ..journal.base import PURGE_BATCH, Journal

#: The first and the smallest page of a pass's purge (records).
MIN_PAGE = 16

#: Processes whose state a checkpoint holds whole: entries before their last checkpoint are dropped.
CHECKPOINTED_PROCESSES = ("mcp-durable/redaction",)


@dataclass(frozen=True, slots=True)
class RetentionSchedule:
    """When and how a server cleans its journal up (see the module docstring)."""

    interval: float = 300.0
    compact_garbage_ratio: float | None = 0.5  # None: never compact by itself
    compact_min_bytes: int = 8 * 1024 * 1024
    lifecycle: bool = True  # drop lifecycle entries folded into a checkpoint
    purge_page_s: float = 0.005  # about how long one page of the purge holds the journal's writer


@dataclass(slots=True)
class PurgePages:
    """How many records the next page of a purge asks for: `MIN_PAGE` at first, then sized from
    the full pages before it (a last page, which found fewer than it asked for, says nothing
    of what a full one costs and leaves the size as it was). Kept from one pass to the next by
    `BackgroundRetention`."""

    size: int = MIN_PAGE


@dataclass(frozen=True, slots=True)
class RetentionPass:
    """What one pass reclaimed."""

    at: float
    duration_s: float
    records_purged: int
    step_entries_dropped: int
    lifecycle_entries_dropped: int
    compacted: bool
    bytes_reclaimed: int
    size_bytes: int | None


@dataclass(slots=True)
class RetentionReport:
    """Every pass so far, summed, and the last one (for `journal://stats`)."""

    passes: int = 0
    records_purged: int = 0
    entries_dropped: int = 0
    compactions: int = 0
    bytes_reclaimed: int = 0
    last: RetentionPass | None = None
    last_compaction_at: float | None = None
    history: list[tuple[float, int | None]] = field(default_factory=list)  # (at, size_bytes), last 60

    def add(self, done: RetentionPass) -> None:
        self.passes += 1
        self.records_purged += done.records_purged
        self.entries_dropped += done.step_entries_dropped + done.lifecycle_entries_dropped
        self.bytes_reclaimed += done.bytes_reclaimed
        if done.compacted:
            self.compactions += 1
            self.last_compaction_at = done.at
        self.last = done
        self.history = [*self.history[-59:], (done.at, done.size_bytes)]

    def as_dict(self) -> dict[str, Any]:
        return {
            "passes": self.passes,
            "records_purged": self.records_purged,
            "entries_dropped": self.entries_dropped,
            "compactions": self.compactions,
            "bytes_reclaimed": self.bytes_reclaimed,
            "last_compaction_at": self.last_compaction_at,
            "last": asdict(self.last) if self.last is not None else None,
        }


async def retention_pass(engine: Engine, schedule: RetentionSchedule, pages: PurgePages | None = None) -> RetentionPass:
    """One pass of retention over `engine`'s journal (see the module docstring); its purge
    starts at `pages.size` records a page and leaves there the size it settled on."""
    began = time.perf_counter()
    await engine.start()
    journal = engine.journal
    now = engine.clock()
    purged, steps = await purge_expired_in_pages(journal, now, schedule.purge_page_s, pages)
    lifecycle = await _fold_checkpointed(engine) if schedule.lifecycle else 0
    compacted, reclaimed = await _compact_if_worth_it(engine, schedule, now)
    size = (await journal.stats()).size_bytes
    return RetentionPass(now, time.perf_counter() - began, purged, steps, lifecycle, compacted, reclaimed, size)


async def purge_expired_in_pages(
    journal: Journal, now: float, page_s: float, pages: PurgePages | None = None
) -> tuple[int, int]:
    """Drop every record expired at `now` with its runs' durable steps, in pages sized to take
    about `page_s` each, waiting after each page as long as it took (the module docstring);
    returns how many records and step entries went. The first page asks for `pages.size`
    records, and `pages.size` is left at what the next pass's first page should ask for."""
    pages = pages if pages is not None else PurgePages()
    records = steps = 0
    while True:
        limit = pages.size
        began = time.perf_counter()
        done = await journal.purge_expired_calls(now, limit)
        took = time.perf_counter() - began
        records += len(done.calls)
        steps += done.step_entries
        if len(done.calls) < limit:
            # Fewer than asked for: nothing expired at `now` is left (`purge_expired_calls`),
            # but what another transaction held on Postgres. Asking again would take the
            # writer once more, for a commit of nothing, while calls may be waiting for it.
            return records, steps
        # The next page scaled by how long this one held the writer against the budget, at most
        # doubled (a first page may be cheap by luck). Where the journal does not say
        # (`held_s`), its time includes waiting for the writer behind calls and for the commit,
        # which a page's size does not change: so never below MIN_PAGE, where a page is mostly
        # such waits. (Scaled by that whole time on SQLite, pages under steady calls came out at
        # a third of what the budget allows, and three times as many calls met one.)
        held = done.held_s if done.held_s is not None else took
        scaled = int(len(done.calls) * page_s / max(held, 1e-6))
        pages.size = max(MIN_PAGE, min(PURGE_BATCH, 2 * len(done.calls), scaled))
        await anyio.sleep(took)


async def _fold_checkpointed(engine: Engine) -> int:
    """Checkpoint the server's lifecycle and drop the entries a checkpoint already holds."""
    journal = engine.journal
    dropped = 0
    if engine.lifecycle is not None:
        mark = await engine.lifecycle.checkpoint()
        if mark is not None:
            dropped += await journal.purge_entries([engine.lifecycle.process_id], before_seq=mark.seq)
    for process_id in CHECKPOINTED_PROCESSES:
        mark = await journal.last_checkpoint(process_id)
        if mark is not None:
            dropped += await journal.purge_entries([process_id], before_seq=mark.seq)
    return dropped


async def _compact_if_worth_it(engine: Engine, schedule: RetentionSchedule, now: float) -> tuple[bool, int]:
    from ..journal.file import FileJournal

    journal = engine.journal
    if schedule.compact_garbage_ratio is None or not isinstance(journal, FileJournal) or journal.read_only:
        return False, 0
    total, live = journal.live_bytes()
    if total < schedule.compact_min_bytes or (total - live) < schedule.compact_garbage_ratio * total:
        return False, 0
    report = await journal.compact(now)
    return True, max(0, report.bytes_before - report.bytes_after)


class BackgroundRetention:
    """Runs `retention_pass` every `schedule.interval` seconds; keeps the report."""

    def __init__(self, engine: Engine, schedule: RetentionSchedule) -> None:
        self.engine = engine
        self.schedule = schedule
        self.report = RetentionReport()
        self.pages = PurgePages()

    async def run_once(self) -> RetentionPass:
        done = await retention_pass(self.engine, self.schedule, self.pages)
        self.report.add(done)
        return done

    async def run_forever(self) -> None:
        from .schedule import run_every

        await run_every(self.schedule.interval, self.run_once, "retention", at_start=False)
