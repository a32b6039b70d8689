"""The file journal's snapshot at scale: what writing one costs the calls served meanwhile.

    python -m benchmarks.snapshot [--records 1000000 10000000] [--trials 3] [--output FILE]

A file journal writes a snapshot of its whole index every `SNAPSHOT_EVERY` frames and at a
clean close. It is written either from a copy of the index made in the event loop (below
`SNAPSHOT_IN_CHILD_AT` records, and where no child can be forked) or by a forked child
(`snapshot_child`). This trial measures both on the scale case's cached journals
(`scale_build`, built on first use: about 1.5 min for 10^6 and 20 min for 10^7), in a fresh
process per trial, each way in turn, and each with the file synced in pieces as it is written
(`segments.SYNC_EVERY`) or only at its end (as before):

- 16 writers make calls as the server does (a claim, then the completion) without pause; after
  a second, one `snapshot()` is taken while they go on, and they stop a second after it;
- `snapshot`: the time `snapshot()` took (the write and its fsync included);
- `loop's longest pause`: the longest gap a 1 ms ticker saw while the snapshot ran, and in
  the second before it;
- `calls during`: the calls that overlapped the snapshot, their p99 and longest time, against
  the p99 of the second before;
- `extra memory`: the machine's anonymous memory (`AnonPages`, the parent and a child
  together, pages shared copy-on-write counted once) at its highest while the snapshot ran,
  less what it was just before;
- the process's own peak RSS after the open and after the snapshot.

The trials write to a copy of the cached journal (its sealed segments linked, not copied),
removed at the end: calls of principal `snapshot-bench`, each created at its own time after
the built records and completed, expiring as they do. Not part of `make bench`. Results:
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import orjson

from ._recovery_child import _rss

ROOT = Path(__file__).resolve().parent.parent
WRITERS = 16
BEFORE_S = 1.0
AFTER_S = 1.0
#: (written by, synced): a copy in the loop or a forked child; the file synced every
#: `segments.SYNC_EVERY` bytes as it is written, or only at its end (as before 2026-12-08).
MODES = (("copy", "end"), ("child", "end"), ("copy", "pieces"), ("child", "pieces"))


def _anon_bytes() -> int:
    with open("/proc/meminfo", "rb") as meminfo:
        for line in meminfo:
            if line.startswith(b"AnonPages:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no AnonPages in /proc/meminfo")


def _longest_gap(ticks: list[float], start: float, end: float, *, within: bool = False) -> float:
    """The longest time between two ticks of the loop's ticker that touches [start, end]
    (`within`: that lies in it)."""
    gaps = zip(ticks, ticks[1:], strict=False)
    if within:
        return max((b - a for a, b in gaps if a >= start and b <= end), default=0.0)
    return max((b - a for a, b in gaps if b > start and a < end), default=0.0)


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else float("nan")


async def _trial(path: Path, mode: str, synced: str) -> dict[str, Any]:
    from benchmarks.scale_build import KEPT_S, T_END
    from mcp_durable.journal.file import FileJournal, segments
    from mcp_durable.journal.file import journal as file_journal
    from mcp_durable.journal.model import CallIdentity, CallRecord, CallState

    file_journal.SNAPSHOT_IN_CHILD_AT = 0 if mode == "child" else 10**15
    if synced == "end":
        segments.SYNC_EVERY = 2**62
    file_journal.SNAPSHOT_EVERY = 10**15  # only the snapshot this trial takes
    journal = FileJournal(path)
    began = time.perf_counter()
    await journal.open()
    opened_s = time.perf_counter() - began
    rss_open = _rss()
    tag = os.urandom(6).hex()
    calls: list[tuple[float, float]] = []  # (start, end)
    stop = anyio.Event()

    async def writer(w: int) -> None:
        n = 0
        while not stop.is_set():
            key = f"{tag}-{w}-{n}"
            n += 1
            start = time.perf_counter()
            created = T_END + (start - began)  # after every built record, each its own time
            record = CallRecord(
                identity=CallIdentity("snapshot-bench", "refund", key),
                fingerprint="f",
                state=CallState.PENDING,
                version=1,
                run_id=f"run-{key}",
                attempts=1,
                created_at=created,
                updated_at=created,
                owner="bench",
                lease_until=created + 30,
                arguments=b'{"a":1}',
            )
            await journal.claim(record, created)
            done = replace(
                record, version=2, state=CallState.COMPLETED, result=b'{"ok":1}', expires_at=created + KEPT_S
            )
            await journal.swap(1, done)
            calls.append((start, time.perf_counter()))

    ticks: list[float] = []

    async def ticker() -> None:
        while not stop.is_set():
            ticks.append(time.perf_counter())
            await anyio.sleep(0.001)

    peak_anon = [0]
    sampling = threading.Event()

    def sampler() -> None:
        while sampling.is_set():
            peak_anon[0] = max(peak_anon[0], _anon_bytes())
            time.sleep(0.002)

    async with anyio.create_task_group() as tg:
        for w in range(WRITERS):
            tg.start_soon(writer, w)
        tg.start_soon(ticker)
        await anyio.sleep(BEFORE_S)
        anon_before = _anon_bytes()
        peak_anon[0] = anon_before
        sampling.set()
        thread = threading.Thread(target=sampler, daemon=True)
        thread.start()
        snap_start = time.perf_counter()
        await journal.snapshot()
        snap_end = time.perf_counter()
        sampling.clear()
        thread.join()
        await anyio.sleep(AFTER_S)
        stop.set()
    await journal.aclose()
    during = [end - start for start, end in calls if start < snap_end and end > snap_start]
    before = [end - start for start, end in calls if snap_start - BEFORE_S <= start and end <= snap_start]
    return {
        "mode": mode,
        "synced": synced,
        "open_s": opened_s,
        "snapshot_s": snap_end - snap_start,
        "loop_gap_ms": _longest_gap(ticks, snap_start, snap_end) * 1e3,
        "loop_gap_before_ms": _longest_gap(ticks, snap_start - BEFORE_S, snap_start, within=True) * 1e3,
        "calls_during": len(during),
        "p99_during_ms": _p99(during) * 1e3,
        "max_during_ms": max(during, default=float("nan")) * 1e3,
        "p99_before_ms": _p99(before) * 1e3,
        "extra_anon_mb": (peak_anon[0] - anon_before) / 2**20,
        "rss_open_mb": rss_open / 2**20,
        "rss_peak_mb": _rss() / 2**20,
    }


def _scratch_copy(source: Path, target: Path) -> None:
    """A journal the trials may write without changing the cached one: its sealed segments
    linked (the journal never writes them again; compaction, which would, finds nothing
    expired), the active segment and every other file copied."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    segments = sorted(source.glob("seg-*.log"))
    for item in source.iterdir():
        if item in segments[:-1]:
            os.link(item, target / item.name)
        else:
            shutil.copy2(item, target / item.name)


def _run_trial(path: Path, mode: str, synced: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.snapshot", "--trial", mode, synced, str(path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"trial {mode} on {path} failed: {done.stderr.strip()[-600:]}")
    report: dict[str, Any] = orjson.loads(done.stdout.splitlines()[-1])
    return report


def _row(records: int, r: dict[str, Any]) -> str:
    synced = "at its end" if r["synced"] == "end" else "every 8 MiB"
    return (
        f"| {records:,} | {r['mode']} | {synced} | {r['snapshot_s'] * 1e3:,.0f} | "
        f"{r['loop_gap_ms']:,.1f} ({r['loop_gap_before_ms']:,.1f}) | {r['calls_during']:,} | "
        f"{r['p99_during_ms']:,.1f} / {r['max_during_ms']:,.1f} | {r['p99_before_ms']:,.1f} | "
        f"{r['extra_anon_mb']:,.0f} | {r['rss_open_mb']:,.0f} / {r['rss_peak_mb']:,.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=None, help="the scale case's cache (default: the benchmarks')")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--trial", nargs=3, metavar=("MODE", "SYNCED", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trial:
        mode, synced, path = args.trial
        print(orjson.dumps(anyio.run(_trial, Path(path), mode, synced)).decode())
        return
    from . import scale_build
    from .common import default_cache_dir

    cache = args.cache or default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    lines = [
        f"snapshot trial, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {WRITERS} writers, "
        f"{args.trials} trials of each way, in turn",
        "",
        "| records | written by | synced | snapshot, ms | loop's longest pause, ms (the second before) "
        "| calls during | their p99 / max, ms | p99 the second before, ms | extra memory, MB "
        "| process peak RSS after open / after snapshot, MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for records in args.records:
        url, took = anyio.run(scale_build.ensure, "file", records, cache)
        if took is not None:
            print(f"(built {records:,} records in {took:,.0f} s)", flush=True)
        path = cache / f"snapshot-trial-{records}"
        _scratch_copy(Path(url[len("file://") :]), path)
        for trial in range(args.trials):
            for mode, synced in MODES if trial % 2 == 0 else MODES[::-1]:
                line = _row(records, _run_trial(path, mode, synced))
                lines.append(line)
                print(line, flush=True)
        shutil.rmtree(path, ignore_errors=True)
    if args.output:
        args.output.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
