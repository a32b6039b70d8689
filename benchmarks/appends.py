"""Case 3: journal appends, group commit versus one fsync per append, at 1, 16 and 64 writers.

Writers are tasks appending process entries (`Journal.append`, durable when it returns) as fast
as they can. The baseline is written here, as simply as it can be: each append writes one record
of the same size to a file and fsyncs it before the next (`write` + `fsync`, inline, no thread
hop: the fastest a journal without group commit can be). The file journal shares one fsync among
the appends that arrive while one is in progress; SQLite (its writer thread's one transaction per
batch) and Postgres (one multi-row statement and commit per batch, at most 32 appends, sent back
to back over one pipelined connection, a second batch in flight only beside a full one) are shown
beside it.
"""

from __future__ import annotations

import os
import time
import uuid

import anyio
import orjson

from mcp_durable.journal import Journal, create_journal

from .common import CaseResult, Settings, Table, Target, journal_urls, median, rate, ratio, skipped_journals

WRITERS = (1, 16, 64)
TARGET_WRITERS = 64
TARGET_RATIO = 10.0
#: The file journal's own bar (the file journal issue): durable appends by 64 writers, fsync on.
TARGET_RATE = 50_000
PROCESS = "bench/appender"


def entry_data(i: int) -> dict[str, object]:
    """A typical process entry: a step number and a little context (about 120 bytes of JSON)."""
    return {"step": i, "order_id": f"O-{i:08d}", "note": "refund issued; provider reference attached"}


def baseline_record(i: int) -> bytes:
    """What one append writes in the baseline: the entry as JSON plus an 8-byte length/seq header,
    about the size of a framed record in the file journal."""
    body = orjson.dumps({"p": PROCESS, "t": "context_update", "d": entry_data(i), "ts": time.time()})
    return len(body).to_bytes(4, "little") + i.to_bytes(4, "little") + body


def baseline(path: str, total: int) -> float:
    """Appends per second with one `write` + `fsync` per append.

    Inline and serial: without group commit, concurrent writers take turns on the file anyway,
    so the rate does not depend on how many there are (and a thread hop would only slow it).
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        records = [baseline_record(i) for i in range(total)]
        began = time.perf_counter()
        for record in records:
            os.write(fd, record)
            os.fsync(fd)
        return total / (time.perf_counter() - began)
    finally:
        os.close(fd)


async def journal_appends(journal: Journal, writers: int, total: int, start: int) -> float:
    """Appends per second of `total` appends by `writers` concurrent tasks."""
    remaining = total
    counter = start

    async def writer() -> None:
        nonlocal remaining, counter
        while remaining > 0:
            remaining -= 1
            counter += 1
            await journal.append(PROCESS, "context_update", entry_data(counter), time.time())

    began = time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(writers):
            group.start_soon(writer)
    return total / (time.perf_counter() - began)


async def run(settings: Settings) -> CaseResult:
    result = CaseResult("appends")
    reps = settings.pick(1, 3)
    urls = journal_urls(settings, memory=False)
    journals = {name: create_journal(url) for name, url in urls.items()}
    for journal in journals.values():
        await journal.open()
    rates: dict[tuple[int, str], list[float]] = {}
    done = 0
    try:
        for writers in WRITERS:
            # Enough appends that a run lasts well over a scheduler tick even at 100k/s.
            total = settings.pick(200, 4000)
            for _ in range(reps):
                path = str(settings.workdir / f"baseline-{uuid.uuid4().hex[:6]}.log")
                rates.setdefault((writers, "baseline"), []).append(baseline(path, total))
                os.unlink(path)
                for name, journal in journals.items():
                    # One writer: SQLite and Postgres commit (and sync) once per append, slower, so
                    # fewer. Many writers share commits on every journal: as many appends as the
                    # baseline, so a run of a few dozen statements is not timed on its first ones.
                    n = total if name == "file" or writers > 1 else max(50, total // 8)
                    rates.setdefault((writers, name), []).append(await journal_appends(journal, writers, n, done))
                    done += n
    finally:
        for journal in journals.values():
            await journal.aclose()

    names = list(journals)
    table = Table(
        "3. Journal appends per second (durable when append returns)",
        ["writers", "baseline: write + fsync each", *names, *[f"{n} / baseline" for n in names]],
    )
    table.notes.append(
        f"median of {reps} interleaved repetitions of {settings.pick(200, 4000)} appends (SQLite and Postgres an "
        f"eighth of that at 1 writer); "
        f"fsync measured at start: {settings.fsync_s * 1e6:,.0f} µs; records of about "
        f"{len(baseline_record(0))} bytes."
    )
    table.notes.extend(skipped_journals())
    for writers in WRITERS:
        base = median(rates[(writers, "baseline")])
        values = [median(rates[(writers, n)]) for n in names]
        table.add(writers, rate(base), *[rate(v) for v in values], *[ratio(v / base) for v in values])
    result.tables.append(table)
    # The bar is the file journal's (the embedded default, the one with group commit of its own).
    name = f"Group commit ≥ {TARGET_RATIO:.0f}× one fsync per append at {TARGET_WRITERS} writers [file]"
    rate_name = f"Durable appends at {TARGET_WRITERS} writers ≥ {TARGET_RATE:,}/s [file]"
    if "file" not in names:
        result.targets.append(Target(name, f"≥ {TARGET_RATIO:.0f}x", "file journal not built", None))
        result.targets.append(Target(rate_name, f"≥ {rate(TARGET_RATE)}", "file journal not built", None))
    else:
        measured = median(rates[(TARGET_WRITERS, "file")])
        result.targets.append(Target(rate_name, f"≥ {rate(TARGET_RATE)}", rate(measured), measured >= TARGET_RATE))
        base = median(rates[(TARGET_WRITERS, "baseline")])
        value = median(rates[(TARGET_WRITERS, "file")]) / base
        result.targets.append(
            Target(
                name,
                f"≥ {TARGET_RATIO:.0f}x",
                f"{ratio(value)} ({rate(value * base)} vs {rate(base)})",
                value >= TARGET_RATIO,
            )
        )
    # Issue 34's bar for Postgres: its batches of appends (one statement and commit each) against
    # the same baseline.
    pg_name = f"Group commit ≥ {TARGET_RATIO:.0f}× one fsync per append at {TARGET_WRITERS} writers [postgres]"
    if "postgres" not in names:
        result.targets.append(Target(pg_name, f"≥ {TARGET_RATIO:.0f}x", "Postgres not reachable", None))
    else:
        base = median(rates[(TARGET_WRITERS, "baseline")])
        measured = median(rates[(TARGET_WRITERS, "postgres")])
        result.targets.append(
            Target(
                pg_name,
                f"≥ {TARGET_RATIO:.0f}x",
                f"{ratio(measured / base)} ({rate(measured)} vs {rate(base)})",
                measured / base >= TARGET_RATIO,
            )
        )
    return result
