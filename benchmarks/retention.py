"""Case 11: a server under steady load with a 1-second retention keeps its journal bounded.

A durable tool with one durable step (so each call leaves a record and a step entry) is called
without pause, each call a new key, for `seconds`, through the in-memory client, with records
kept 1 s (`ToolPolicy(key="derived", retention=1.0)`). Twice per journal: with the server's retention schedule
(every 0.5 s: purge expired records and their steps; the file journal compacts online once
half its segments are garbage and they hold at least 256 KiB) and with it off. The journal's
size is sampled every second; call latency is measured throughout, so a pause in serving while
retention or compaction runs would show as its maximum.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
from mcp import Client

from mcp_durable import DurableServer, ToolPolicy, current_call
from mcp_durable.operations.retention import RetentionSchedule

from .common import CaseResult, Settings, Table, dir_size, journal_urls, median, skipped_journals
from .timing import check_result

TOOL = "work"


def _server(url: str, schedule: RetentionSchedule | None) -> DurableServer:
    server = DurableServer(
        "bench-retention", journal=url, retention_schedule=schedule, reconcile_interval=None, log_level="WARNING"
    )

    async def work(n: int) -> str:
        await current_call().step("one", lambda: n)
        return "ok"

    server.add_tool(work, name=TOOL, durable=ToolPolicy(key="derived", retention=1.0))
    return server


def _size(name: str, url: str) -> int:
    path = url.split("://", 1)[1]
    if name == "sqlite":
        db = Path(path[1:] if path.startswith("/") else path)
        return sum(dir_size(p) for p in db.parent.glob(db.name + "*"))
    return dir_size(Path(path))


async def _load(
    name: str, url: str, schedule: RetentionSchedule | None, seconds: int
) -> tuple[list[int], list[float], int]:
    """Sizes sampled each second, call latencies, and calls made."""
    server = _server(url, schedule)
    sizes: list[int] = []
    latencies: list[float] = []
    async with Client(server) as client, anyio.create_task_group() as group:

        async def sample() -> None:
            for _ in range(seconds + 1):
                sizes.append(_size(name, url))
                await anyio.sleep(1.0)

        group.start_soon(sample)
        end, n = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            began = time.perf_counter()
            check_result(await client.call_tool(TOOL, {"n": n}))
            latencies.append(time.perf_counter() - began)
            n += 1
        group.cancel_scope.cancel()
    return sizes, latencies, n


def _kib(size: int) -> str:
    return f"{size / 1024:,.0f} KiB"


async def run(settings: Settings) -> CaseResult:
    result = CaseResult("retention")
    seconds = settings.pick(2, 30)  # quick: a smoke run of the case, retention passes included
    schedule = RetentionSchedule(interval=0.5, compact_garbage_ratio=0.5, compact_min_bytes=256 * 1024)
    urls = {k: v for k, v in journal_urls(settings, memory=False).items() if k in ("file", "sqlite")}
    over_time = Table(
        f"11. Journal size over time under steady load, records kept 1 s ({seconds} s)",
        ["journal", "retention", "calls", *[f"{t} s" for t in range(0, seconds + 1, max(1, seconds // 6))], "max"],
    )
    latency = Table("11. Call latency while retention runs", ["journal", "retention", "median", "p99", "max"])
    for name, url in urls.items():
        for label, chosen in (("on", schedule), ("off", None)):
            off_url = url.replace("/file", "/file-off").replace("journal.db", "journal-off.db")
            run_url = url if label == "on" else off_url
            sizes, latencies, calls = await _load(name, run_url, chosen, seconds)
            picks = [sizes[min(t, len(sizes) - 1)] for t in range(0, seconds + 1, max(1, seconds // 6))]
            over_time.add(name, label, f"{calls:,}", *[_kib(s) for s in picks], _kib(max(sizes)))
            ordered = sorted(latencies)
            p99 = ordered[int(len(ordered) * 0.99)]
            latency.add(
                name, label, f"{median(ordered) * 1e3:.2f} ms", f"{p99 * 1e3:.2f} ms", f"{ordered[-1] * 1e3:.2f} ms"
            )
    over_time.notes.append(
        "each call a new key and one durable step; retention on: RetentionSchedule(interval=0.5, "
        "compact_garbage_ratio=0.5, compact_min_bytes=256 KiB); sizes are the journal's files (SQLite: "
        "database + WAL), sampled once a second."
    )
    over_time.notes.extend(skipped_journals())
    result.tables += [over_time, latency]
    return result
