"""Case 13: retention at scale — one pass over 10^6 call records with 1 % expired, and the calls made meanwhile.

A journal of 1,000,000 call records (`scale_build.scale_record`, the scale case's records, none
of them expired), file, SQLite and Postgres, built once with the scale case's builders and kept
in the benchmark cache under names of its own (`retention-<backend>-<N>-<tag>`, Postgres schema
`retention_<N>_<tag>`), so that this case and the scale case never hold one journal at once.
Before each measured pass with work to do, 10,000 more records (1 % of the journal) are written
through the journal's own protocol, exactly as a call leaves them: claimed PENDING, one durable
step appended under the owner's fence, then completed with an expiry in the past (`alice`'s
`refund`, created in the journal's last days, expired a day later). Not timed, with no call
in flight.

What is measured, per journal, in `rounds` rounds (each variant once per round, in alternating
order, one server and one in-memory client per journal):

- **1 % expired**: one retention pass exactly as the server's `RetentionSchedule` runs it
  (`BackgroundRetention.run_once`: expired records and their steps purged, lifecycle
  checkpointed, the file journal's compaction check), timed; it must purge the 10,000 records
  and their 10,000 steps;
- **nothing to delete**: a pass every `PASS_GAP_S` after the last one ended, for `window`
  seconds, each timed; none may purge;
- **no pass**: `window` seconds of calls alone;

and in each, durable calls made one after another without pause (the no-op through the
in-memory client, each a miss: a new derived key), from before the pass starts until after it
ends. A call counts for a pass when it overlaps it (began before the pass ended, ended after it
began). p50, p99 and max of those calls show whether a pass stalls serving: the event loop or
the journal's writer held while it deletes.

`--quick` builds and measures 10,000 records (100 expired). Backends can be narrowed with
`MCP_DURABLE_BENCH_RETENTION_BACKENDS=sqlite,postgres`.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import anyio
from mcp import Client

from mcp_durable import DurableServer, ToolPolicy
from mcp_durable.journal import create_journal
from mcp_durable.journal.base import Journal
from mcp_durable.journal.model import CallIdentity, CallRecord, CallState
from mcp_durable.operations.retention import BackgroundRetention, RetentionPass, RetentionSchedule

from . import scale_build
from .common import (
    PG_BASE,
    CaseResult,
    Settings,
    Table,
    file_journal_available,
    in_turn,
    median,
    ms,
    postgres_available,
    ratio,
    skipped_journals,
)
from .servers import TOOL, noop
from .timing import BenchmarkError, check_result

SIZE_FULL = 1_000_000
SIZE_QUICK = 10_000
EXPIRED_SHARE = 100  # one record in this many is expired before a pass with work to do
#: The calls' own records are kept this long: none expires while a run measures (a pass with
#: nothing to delete finds nothing), and the next run's first pass purges them.
CALLS_KEPT_S = 3600.0
INJECT_WRITERS = 64
PASS_GAP_S = 0.01  # between two passes with nothing to delete
BACKENDS_ENV = "MCP_DURABLE_BENCH_RETENTION_BACKENDS"
VARIANTS = ("1 % expired", "nothing to delete", "no pass")


# -- the journals -------------------------------------------------------------------------------------


def _root(backend: str, size: int, cache: Path) -> Path:
    return cache / f"retention-{backend}-{size}-{scale_build.tag(backend)}"


def _schema(size: int) -> str:
    return f"retention_{size}_{scale_build.tag('postgres').replace('-', '_')}"


def journal_url(backend: str, size: int, cache: Path) -> str:
    if backend == "file":
        return f"file://{_root(backend, size, cache)}/file"
    if backend == "sqlite":
        return f"sqlite:///{_root(backend, size, cache)}/journal.db"
    return f"{PG_BASE}?schema={_schema(size)}"


async def ensure(backend: str, size: int, cache: Path) -> tuple[str, float | None]:
    """The URL of this case's journal of `size` records on `backend` (built by the scale case's
    builders on first use), and the seconds the build took (None: it came from the cache)."""
    url = journal_url(backend, size, cache)
    root = _root(backend, size, cache)
    if backend == "postgres":
        if await anyio.to_thread.run_sync(_pg_ready, size):
            return url, None
    elif (root / "READY").exists():
        return url, None
    began = time.perf_counter()
    if backend == "postgres":
        await anyio.to_thread.run_sync(_pg_drop, size)
        journal = create_journal(url)  # the schema, migrated exactly as the journal does
        await journal.open()
        await journal.aclose()
        await anyio.to_thread.run_sync(scale_build._fill_postgres, _schema(size), size)
    else:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        if backend == "file":
            await scale_build._build_file(url + "?durability=relaxed", size)
        else:
            await scale_build._build_sqlite(url, root / "journal.db", size)
        (root / "READY").write_text(f"{size} calls\n")
    return url, time.perf_counter() - began


def _pg_ready(size: int) -> bool:
    import psycopg

    with psycopg.connect(PG_BASE, connect_timeout=5) as conn:
        found = conn.execute(
            "SELECT 1 FROM information_schema.tables WHERE table_schema = %s AND table_name = 'scale_ready'",
            (_schema(size),),
        ).fetchone()
    return found is not None


def _pg_drop(size: int) -> None:
    import psycopg

    with psycopg.connect(PG_BASE, connect_timeout=5, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{_schema(size)}" CASCADE')


# -- the expired records --------------------------------------------------------------------------------


def expired_records(count: int, tag: str) -> Iterator[tuple[CallRecord, CallRecord]]:
    """`count` records as claimed (PENDING) and as completed (expired a day after creation, in
    the journal's last days: before every other record's expiry, long before now); `tag` in
    their keys, new for each batch (a batch a stopped run left half-written stays, in doubt)."""
    for i in range(count):
        created = scale_build.T_END - 3 * 86400.0 + i * 0.5
        run_id = f"expired-run-{tag}-{i:07d}"
        pending = CallRecord(
            CallIdentity("alice", "refund", f"expired-{tag}-{i:07d}"),
            f"{i:064x}",
            CallState.PENDING,
            1,
            run_id,
            1,
            created,
            created,
            owner="bench-retention",
            lease_until=time.time() + 3600.0,
            arguments=b'{"amount":%d,"order_id":"E-%07d"}' % (i % 9973, i),
        )
        done = replace(
            pending,
            state=CallState.COMPLETED,
            version=2,
            updated_at=created + 0.05,
            owner=None,
            lease_until=None,
            completed_at=created + 0.05,
            expires_at=created + 86400.0,
            result=scale_build.RESULT,
        )
        yield pending, done


async def inject_expired(journal: Journal, count: int) -> None:
    """Write `count` expired records, each with one durable step, as calls leave them."""
    records = expired_records(count, f"{time.time_ns():x}")

    async def writer() -> None:
        for pending, done in records:  # one shared iterator: each record written once
            won, _ = await journal.claim(pending, time.time())
            fence = pending.fence
            if not won or fence is None:
                raise BenchmarkError(f"an expired record's claim found {pending.identity} standing")
            if await journal.append_step(pending.identity, fence, 0, {"value": "charged"}, pending.created_at) is None:
                raise BenchmarkError(f"the step of {pending.identity} was refused")
            if not await journal.swap(1, done):
                raise BenchmarkError(f"the completion of {pending.identity} was refused")

    async with anyio.create_task_group() as group:
        for _ in range(INJECT_WRITERS):
            group.start_soon(writer)


# -- the measurement ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Figures:
    """One variant on one journal, over every round."""

    pass_s: list[float] = field(default_factory=list)
    calls_s: list[float] = field(default_factory=list)
    purged: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    compactions: int = 0


def _server(url: str) -> DurableServer:
    server = DurableServer(
        "bench-retention-scale",
        journal=url,
        reconcile_interval=None,
        retention_schedule=None,  # the case runs the passes itself, as the schedule would
        log_level="WARNING",
    )
    server.add_tool(noop, name=TOOL, durable=ToolPolicy(idempotent=True, key="derived", retention=CALLS_KEPT_S))
    return server


class Caller:
    """Durable calls, one after another without pause, each a miss; keeps (began, ended) of each."""

    def __init__(self, client: Client, misses: Iterator[int]) -> None:
        self.client = client
        self.misses = misses
        self.calls: list[tuple[float, float]] = []
        self.stopping = False

    async def run(self) -> None:
        clock = time.perf_counter
        while not self.stopping:
            arguments = {"n": next(self.misses)}
            began = clock()
            result = await self.client.call_tool(TOOL, arguments)
            self.calls.append((began, clock()))
            check_result(result, replayed=False)

    def during(self, spans: list[tuple[float, float]]) -> list[float]:
        """Seconds of the calls that overlap any of `spans`."""
        return [end - began for began, end in self.calls if any(began < b and end > a for a, b in spans)]


async def _measure(
    variant: str, retention: BackgroundRetention, caller: Caller, window: float, expired: int
) -> tuple[list[float], list[tuple[float, float]], list[RetentionPass]]:
    """Run `variant` while `caller` calls; the passes' seconds, their spans, and what they did."""
    spans: list[tuple[float, float]] = []
    done: list[RetentionPass] = []
    caller.calls, caller.stopping = [], False
    async with anyio.create_task_group() as group:
        group.start_soon(caller.run)
        await anyio.sleep(0.1)  # calls in flight before the pass starts
        if variant == "no pass":
            began = time.perf_counter()
            await anyio.sleep(window)
            spans.append((began, time.perf_counter()))
        else:
            end = time.perf_counter() + window
            while True:
                began = time.perf_counter()
                done.append(await retention.run_once())
                spans.append((began, time.perf_counter()))
                if variant == "1 % expired" or time.perf_counter() >= end:
                    break
                # Passes one after another would never let the calls run: a pass with nothing to
                # delete may finish without waiting for anything (its one write committed inline).
                await anyio.sleep(PASS_GAP_S)
        await anyio.sleep(0.05)  # and after it ends
        caller.stopping = True
    for one in done:
        want = expired if variant == "1 % expired" else 0
        if one.records_purged != want or one.step_entries_dropped != want:
            raise BenchmarkError(f"a pass ({variant}) purged {one.records_purged} records, wanted {want}: {one}")
    return [b - a for a, b in spans], spans, done


async def _journal(backend: str, url: str, size: int, rounds: int, window: float) -> dict[str, Figures]:
    figures = {variant: Figures() for variant in VARIANTS}
    expired = size // EXPIRED_SHARE
    server = _server(url)
    async with Client(server) as client:
        journal = server.engine.journal
        retention = BackgroundRetention(server.engine, RetentionSchedule())
        await retention.run_once()  # an earlier run's leftovers (its calls, once expired) go now
        caller = Caller(client, itertools.count(-time.time_ns() // 1000, -1))  # never a built record's key
        for repetition in range(rounds):
            for variant in in_turn(VARIANTS, repetition):
                if variant == "1 % expired":
                    await inject_expired(journal, expired)
                    await anyio.sleep(0.5)  # the injection's commits and snapshots settle
                took, spans, done = await _measure(variant, retention, caller, window, expired)
                kept = figures[variant]
                kept.calls_s += caller.during(spans)
                if variant != "no pass":
                    kept.pass_s += took
                    kept.purged += [d.records_purged for d in done]
                    kept.steps += [d.step_entries_dropped for d in done]
                    kept.compactions += sum(d.compacted for d in done)
    return figures


def _backends() -> list[str]:
    available = (["file"] if file_journal_available() else []) + ["sqlite"]
    available += ["postgres"] if postgres_available() else []
    chosen = os.environ.get(BACKENDS_ENV, "")
    if chosen.strip():
        return [b for b in available if b in {c.strip() for c in chosen.split(",")}]
    return available


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


async def run(settings: Settings) -> CaseResult:
    result = CaseResult("retention at scale")
    size = settings.pick(SIZE_QUICK, SIZE_FULL)
    rounds = settings.pick(1, 5)
    window = 0.3 if settings.quick else 1.0
    backends = _backends()
    table = Table(
        f"13. Retention on {size:,} records with 1 % expired: one pass, and the calls made during it",
        ["journal", "pass", "pass time", "purged", "calls", "p50", "p99", "max", "p99 / no pass"],
    )
    built: list[str] = []
    for backend in backends:
        url, took = await ensure(backend, size, settings.cache_dir)
        if took is not None:
            built.append(f"{backend} built in {took:,.0f} s")
        figures = await _journal(backend, url, size, rounds, window)
        base = _quantile(sorted(figures["no pass"].calls_s), 0.99)
        for variant in VARIANTS:
            f = figures[variant]
            ordered = sorted(f.calls_s)
            p99 = _quantile(ordered, 0.99)
            table.add(
                backend,
                variant,
                ms(median(f.pass_s)) if f.pass_s else "–",
                f"{median(f.purged):,.0f} + {median(f.steps):,.0f} steps" if f.purged else "–",
                f"{len(ordered):,}",
                ms(median(ordered)),
                ms(p99),
                ms(ordered[-1]) if ordered else "–",
                ratio(p99 / base) if variant != "no pass" else "–",
            )
            if f.compactions:
                table.notes.append(f"{backend}, {variant}: {f.compactions} of its passes compacted the file journal")
    table.notes.append(
        f"{rounds} rounds, each variant once per round in alternating order; pass = "
        "BackgroundRetention.run_once with the default RetentionSchedule (median); 1 % expired: "
        f"{size // EXPIRED_SHARE:,} records, each with one durable step, written before the pass; nothing to "
        f"delete: a pass {PASS_GAP_S * 1e3:.0f} ms after the last one ended, for {window} s; calls: misses one "
        "after another through the in-memory client, counted when they overlap a pass (no pass: the whole window)"
    )
    table.notes.extend(built)
    table.notes.extend(skipped_journals())
    result.tables.append(table)
    return result
