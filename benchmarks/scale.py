"""Case 12: scale — what each operation costs as the journal grows from 10^4 to 10^7 call records.

Journals of 10,000, 100,000, 1,000,000 and 10,000,000 call records (`scale_build`: four
principals, four tools, mostly completed, a few failed, released, tasks, a constant 20 open
tasks, nothing expired), file, SQLite and Postgres, built on first use and cached (about 16 GB
in all with the 10^7 journals: `scale_build`). At each size, the median of:

- a miss and a replay (the no-op through the in-memory client; each replay of a stored record
  this process has not seen, so it reads the journal),
- `journal://stats` read as an admin and as a non-admin principal (the in-memory client),
- the console overview (`console.queries.overview`, admin, its clock at the newest built record
  so that its hour holds 1,000 records at every size),
- one page of the console's call list (`console.queries.call_page`, admin, no filter),
- `journal show TOOL KEY`'s lookup (`Journal.find_calls`, of a stored record),
- one retention pass with nothing to delete (`operations.retention.retention_pass`),
- one task-watch pass (`TaskRuns.watch_once`, which finds the 20 open tasks).

Every (journal, size) is open at once, in one process, and sampled in interleaved rounds (each
round a new seeded order of operations and journals), so that the machine's drift falls on every
size alike. Before that, each journal's time to be ready (open and fetch one record) and its peak
RSS are measured in a fresh process (`_scale_child`), three times per journal and size.

The records a run replays and shows are drawn with a seed of its own, printed with the table:
a run that drew the same records as the one before it would find their pages in memory, which
at 10^7 is most of what `journal show` and a replay cost on SQLite (docs/benchmarks.md,
2026-12-07). `MCP_DURABLE_BENCH_SCALE_SEED=N` draws run N's records again.

Sizes and backends can be narrowed with `MCP_DURABLE_BENCH_SCALE_SIZES=10000,100000` and
`MCP_DURABLE_BENCH_SCALE_BACKENDS=file,sqlite`; `--quick` measures 1,000 and 3,000 records. The
benchmark's own calls (misses, lifecycle entries, a checkpoint per retention pass) are written
to the cached journals: a few hundred records per run, nothing the figures can see.
"""

from __future__ import annotations

import itertools
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import orjson
from mcp import Client
from mcp.server.mcpserver import Context

from mcp_durable import DurableServer, ToolPolicy
from mcp_durable.console.queries import CallFilter, call_page, overview
from mcp_durable.journal.base import Journal
from mcp_durable.operations.retention import RetentionSchedule, retention_pass
from mcp_durable.uris import STATS_URI

from . import scale_build
from .common import (
    CaseResult,
    Settings,
    Table,
    Target,
    file_journal_available,
    mb,
    median,
    ms,
    postgres_available,
    ratio,
    skipped_journals,
    verdict,
)
from .servers import TOOL, noop
from .timing import BenchmarkError, check_result

SIZES_FULL = (10_000, 100_000, 1_000_000, 10_000_000)
SIZES_QUICK = (1_000, 3_000)
SIZES_ENV = "MCP_DURABLE_BENCH_SCALE_SIZES"
BACKENDS_ENV = "MCP_DURABLE_BENCH_SCALE_BACKENDS"
SEED_ENV = "MCP_DURABLE_BENCH_SCALE_SEED"
TARGET_SIZE = 10_000_000
TARGET_RATIO = 2.0
READY_SECONDS = 1.5
READY_RSS = 600 * 10**6  # MB, as the bar is stated
ADMIN = "admin"
NON_ADMIN = "alice"  # 30 % of the records
ROOT = Path(__file__).resolve().parent.parent
SCHEDULE = RetentionSchedule()

#: Who the benchmark servers take the caller to be (one caller at a time: the case is sequential).
_asking = ["local"]


def _principal(context: Context[Any, Any] | None) -> str:
    return _asking[0]


@dataclass(slots=True)
class Subject:
    """One journal of one size, served: its server, the client on it, what its samples use."""

    backend: str
    size: int
    server: DurableServer
    client: Client
    rng: random.Random
    misses: Iterator[int]
    replayed: set[int] = field(default_factory=set)

    @property
    def journal(self) -> Journal:
        return self.server.engine.journal

    def replay_target(self) -> int:
        """A stored `noop` record not replayed before in this process (so the engine reads it)."""
        while True:
            i = self.rng.randrange(self.size // 10) * 10 + 2
            if i < self.size and i not in self.replayed and scale_build.is_replay_target(i):
                self.replayed.add(i)
                return i


# -- the operations (each returns the seconds of its measured part) --------------------------------


async def _miss(s: Subject) -> float:
    arguments = {"n": next(s.misses)}
    began = time.perf_counter()
    result = await s.client.call_tool(TOOL, arguments)
    took = time.perf_counter() - began
    check_result(result, replayed=False)
    return took


async def _replay(s: Subject) -> float:
    arguments = {"n": s.replay_target()}
    began = time.perf_counter()
    result = await s.client.call_tool(TOOL, arguments)
    took = time.perf_counter() - began
    check_result(result, replayed=True)
    return took


async def _stats_as(s: Subject, principal: str) -> float:
    _asking[0] = principal
    try:
        began = time.perf_counter()
        result = await s.client.read_resource(STATS_URI)
        took = time.perf_counter() - began
    finally:
        _asking[0] = "local"
    body = orjson.loads(getattr(result.contents[0], "text", "{}"))
    if body.get("scope") != ("all" if principal == ADMIN else "principal") or body.get("calls", 0) < s.size * 0.25:
        raise BenchmarkError(f"journal://stats as {principal} answered {body}")
    return took


async def _stats_admin(s: Subject) -> float:
    return await _stats_as(s, ADMIN)


async def _stats_non_admin(s: Subject) -> float:
    return await _stats_as(s, NON_ADMIN)


async def _overview(s: Subject) -> float:
    began = time.perf_counter()
    found = await overview(s.journal, None, scale_build.T_END + 1)
    took = time.perf_counter() - began
    if found["counts"]["calls"] < s.size or sum(found["per_minute"]) < min(s.size, 1000):
        raise BenchmarkError(f"the console overview answered {found['counts']}, {sum(found['per_minute'])} an hour")
    return took


async def _call_page(s: Subject) -> float:
    began = time.perf_counter()
    page, following = await call_page(s.journal, None, CallFilter(), None)
    took = time.perf_counter() - began
    if len(page) != CallFilter().limit or following is None:
        raise BenchmarkError(f"a page of the call list held {len(page)} records")
    return took


async def _journal_show(s: Subject) -> float:
    i = s.rng.randrange(s.size)
    while i in scale_build.open_slots(s.size):
        i = s.rng.randrange(s.size)
    identity = scale_build.scale_record(i, s.size).identity
    began = time.perf_counter()
    found = await s.journal.find_calls(identity.tool, identity.key)
    took = time.perf_counter() - began
    if [r.identity for r in found] != [identity]:
        raise BenchmarkError(f"journal show {identity.tool} {identity.key} found {len(found)} records")
    return took


async def _retention(s: Subject) -> float:
    began = time.perf_counter()
    done = await retention_pass(s.server.engine, SCHEDULE)
    took = time.perf_counter() - began
    if done.records_purged or done.compacted:
        raise BenchmarkError(f"a retention pass found work to do: {done}")
    return took


async def _task_watch(s: Subject) -> float:
    began = time.perf_counter()
    looked = await s.server.engine.tasks.watch_once()
    took = time.perf_counter() - began
    if looked != scale_build.OPEN_PENDING + scale_build.OPEN_IN_DOUBT:
        raise BenchmarkError(f"a task-watch pass looked at {looked} tasks")
    return took


Operation = Callable[[Subject], Awaitable[float]]
#: The operations, in table order, and how many samples each takes per round.
OPERATIONS: dict[str, tuple[Operation, int]] = {
    "miss": (_miss, 3),
    "replay (stored record)": (_replay, 3),
    "journal://stats, admin": (_stats_admin, 1),
    "journal://stats, non-admin": (_stats_non_admin, 1),
    "console overview": (_overview, 1),
    "call list, one page": (_call_page, 1),
    "journal show (find_calls)": (_journal_show, 1),
    "retention pass, nothing to delete": (_retention, 1),
    "task-watch pass": (_task_watch, 1),
}


# -- the case ---------------------------------------------------------------------------------------


def _seed() -> int:
    """`SEED_ENV`'s seed, or a new one: a run reads records no run before it read, unless told."""
    chosen = os.environ.get(SEED_ENV, "").strip()
    return int(chosen) if chosen else random.SystemRandom().randrange(1_000_000)


def _sizes(settings: Settings) -> tuple[int, ...]:
    chosen = os.environ.get(SIZES_ENV, "")
    if chosen.strip():
        return tuple(sorted({int(s.replace("_", "")) for s in chosen.split(",") if s.strip()}))
    return SIZES_QUICK if settings.quick else SIZES_FULL


def _backends() -> list[str]:
    available = (["file"] if file_journal_available() else []) + ["sqlite"]
    available += ["postgres"] if postgres_available() else []
    chosen = os.environ.get(BACKENDS_ENV, "")
    if chosen.strip():
        return [b for b in available if b in {c.strip() for c in chosen.split(",")}]
    return available


def _duration(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} µs" if seconds < 0.001 else ms(seconds)


def _server(url: str) -> DurableServer:
    server = DurableServer(
        "bench-scale",
        journal=url,
        principal=_principal,
        admin_principals={ADMIN},
        reconcile_interval=None,
        retention_schedule=None,  # the case runs its passes itself
        log_level="WARNING",
    )
    server.add_tool(noop, name=TOOL, durable=ToolPolicy(idempotent=True, key="derived"))
    return server


async def _ready(url: str, backend: str, size: int) -> dict[str, float]:
    i = next(i for i in range(size - 1, 0, -1) if scale_build.is_replay_target(i))
    identity = scale_build.scale_record(i, size).identity
    done = await anyio.run_process(
        [sys.executable, "-m", "benchmarks._scale_child", url, *identity], cwd=ROOT, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"scale child failed on {backend} {size}: {done.stderr.decode()[-2000:]}")
    figures: dict[str, float] = orjson.loads(done.stdout.splitlines()[-1])
    return figures


async def _measure_ready(
    urls: dict[tuple[str, int], str], reps: int, rng: random.Random
) -> dict[tuple[str, int], list[dict[str, float]]]:
    """`reps` fresh-process opens of every journal, interleaved (before any server holds a lock)."""
    runs: dict[tuple[str, int], list[dict[str, float]]] = {subject: [] for subject in urls}
    for _ in range(reps):
        order = list(urls)
        rng.shuffle(order)
        for backend, size in order:
            runs[(backend, size)].append(await _ready(urls[(backend, size)], backend, size))
    return runs


async def _sample_rounds(subjects: list[Subject], rounds: int) -> dict[tuple[str, str, int], list[float]]:
    """Every operation on every subject, in `rounds` rounds after one warm-up round not kept."""
    samples: dict[tuple[str, str, int], list[float]] = {}
    for round_number in range(rounds + 1):
        order = [(name, s) for name in OPERATIONS for s in subjects]
        random.Random(round_number).shuffle(order)
        for name, s in order:
            operation, count = OPERATIONS[name]
            taken = [await operation(s) for _ in range(count)]
            if round_number > 0:
                samples.setdefault((name, s.backend, s.size), []).extend(taken)
    return samples


async def run(settings: Settings) -> CaseResult:
    result = CaseResult("scale")
    sizes, backends = _sizes(settings), _backends()
    urls: dict[tuple[str, int], str] = {}
    built: dict[tuple[str, int], float | None] = {}
    for backend in backends:
        for size in sizes:
            urls[(backend, size)], built[(backend, size)] = await scale_build.ensure(backend, size, settings.cache_dir)
    ready = await _measure_ready(urls, settings.pick(1, 3), random.Random(12))
    rounds = settings.pick(2, 15)
    seed = _seed()
    async with AsyncExitStack() as stack:
        subjects = []
        for (backend, size), url in urls.items():
            server = _server(url)
            client = await stack.enter_async_context(Client(server))
            misses = itertools.count(-time.time_ns() // 1000, -1)  # new keys, never a built record's
            subjects.append(Subject(backend, size, server, client, random.Random(f"{seed}-{size}"), misses))
        samples = await _sample_rounds(subjects, rounds)
    medians = {key: median(values) for key, values in samples.items()}
    result.tables.append(_operations_table(medians, sizes, backends, rounds, seed))
    result.tables.append(_ready_table(ready, built, sizes, backends))
    result.targets.extend(_operation_targets(medians, sizes, backends))
    result.targets.append(_ready_target(ready))
    return result


def _operations_table(
    medians: dict[tuple[str, str, int], float], sizes: tuple[int, ...], backends: list[str], rounds: int, seed: int
) -> Table:
    table = Table(
        "12. Scale: each operation's median as the journal grows",
        ["operation", "journal", *[f"{size:,}" for size in sizes], f"{sizes[-1]:,} / {sizes[0]:,}", "≤ 2x"],
    )
    for name in OPERATIONS:
        for backend in backends:
            row = [medians[(name, backend, size)] for size in sizes]
            grown = row[-1] / row[0]
            table.add(name, backend, *[_duration(x) for x in row], ratio(grown), verdict(grown <= TARGET_RATIO))
    table.notes.append(
        f"median of {rounds} interleaved rounds (after one warm-up round), every journal and size open at once; "
        f"per round {OPERATIONS['miss'][1]} misses and replays, one of each other operation; the records replayed "
        f"and shown drawn with seed {seed} ({SEED_ENV}={seed} draws them again)"
    )
    table.notes.append(
        "records: 4 principals, 4 tools, 97.5 % completed, 1 % failed, 0.5 % released, 1 % tasks, "
        f"{scale_build.OPEN_PENDING + scale_build.OPEN_IN_DOUBT} open tasks at every size, one record every "
        f"{scale_build.SPACING_S} s (1,000 in the overview's hour), none expired (scale_build.py)"
    )
    table.notes.extend(skipped_journals())
    return table


def _ready_table(
    ready: dict[tuple[str, int], list[dict[str, float]]],
    built: dict[tuple[str, int], float | None],
    sizes: tuple[int, ...],
    backends: list[str],
) -> Table:
    table = Table(
        "12b. Scale: ready (open and serve one record) in a fresh process",
        ["journal", "records", "open", "ready", "peak RSS", "RSS above imports", "build"],
    )
    for backend in backends:
        for size in sizes:
            runs = ready[(backend, size)]
            took = built[(backend, size)]
            table.add(
                backend,
                f"{size:,}",
                ms(median(r["open_s"] for r in runs)),
                ms(median(r["ready_s"] for r in runs)),
                mb(max(r["peak_rss"] for r in runs)),
                mb(median(r["peak_rss"] - r["baseline_rss"] for r in runs)),
                "cached" if took is None else f"built in {took:,.0f} s",
            )
    table.notes.append(
        "median of fresh processes (peak RSS: the largest), page cache warm; ready = open + one stored record "
        "fetched; peak RSS = the child's VmHWM, interpreter and imports included"
    )
    return table


def _operation_targets(
    medians: dict[tuple[str, str, int], float], sizes: tuple[int, ...], backends: list[str]
) -> list[Target]:
    targets = []
    for backend in backends:
        name = f"Every operation at {TARGET_SIZE:,} records within 2x of 10,000 [{backend}]"
        if sizes[0] != 10_000 or sizes[-1] != TARGET_SIZE:
            targets.append(Target(name, "≤ 2.0x", f"sizes {sizes[0]:,}-{sizes[-1]:,} measured", None))
            continue
        grown = {op: medians[(op, backend, sizes[-1])] / medians[(op, backend, sizes[0])] for op in OPERATIONS}
        over = [f"{op} {ratio(g)}" for op, g in grown.items() if g > TARGET_RATIO]
        worst = max(grown, key=lambda op: grown[op])
        measured = ("over: " + "; ".join(over)) if over else f"worst: {worst} {ratio(grown[worst])}"
        targets.append(Target(name, "≤ 2.0x", measured, not over))
    return targets


def _ready_target(ready: dict[tuple[str, int], list[dict[str, float]]]) -> Target:
    name = f"File journal ready at {TARGET_SIZE:,} records ≤ {READY_SECONDS} s and ≤ 600 MB"
    runs = ready.get(("file", TARGET_SIZE))
    if not runs:
        return Target(name, "≤ 1.5 s, ≤ 600 MB", "not measured in this run", None)
    took, peak = median(r["ready_s"] for r in runs), max(r["peak_rss"] for r in runs)
    return Target(name, "≤ 1.5 s, ≤ 600 MB", f"{took:.2f} s, {mb(peak)}", took <= READY_SECONDS and peak <= READY_RSS)
