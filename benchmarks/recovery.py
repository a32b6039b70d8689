"""Case 4: recovery — time to open a journal and be ready, and peak RSS, in a fresh process.

At 10,000, 100,000 and 1,000,000 call records (the 1M size is skipped in --quick), and with
process-journal entries at the same sizes (a checkpoint every 1,000 entries; ready = the process
recovered by `ReplayEngine.recover`). The file journal is the one with a bar; SQLite is beside
it. Each measurement runs `benchmarks._recovery_child` in a new interpreter so the RSS is the
open's own; journals are built once and cached (see `build.py`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import orjson

from . import build
from .common import CaseResult, Settings, Table, Target, file_journal_available, mb, median, ms, skipped_journals

SIZES_FULL = (10_000, 100_000, 1_000_000)
SIZES_QUICK = (10_000,)
TARGET_RECORDS = 1_000_000
TARGET_SECONDS = 1.5
TARGET_RSS = 300 * 10**6  # MB, as the bar is stated
ROOT = Path(__file__).resolve().parent.parent


async def measure(url: str, kind: str, count: int) -> dict[str, float]:
    done = await anyio.run_process(
        [sys.executable, "-m", "benchmarks._recovery_child", url, kind, str(count)], cwd=ROOT, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"recovery child failed on {url}: {done.stderr.decode()[-2000:]}")
    result: dict[str, float] = orjson.loads(done.stdout.splitlines()[-1])
    return result


async def run(settings: Settings) -> CaseResult:
    result = CaseResult("recovery")
    sizes = SIZES_QUICK if settings.quick else SIZES_FULL
    reps = settings.pick(1, 3)
    backends = (["file"] if file_journal_available() else []) + ["sqlite"]
    table = Table(
        "4. Recovery: open and be ready, in a fresh process",
        ["journal", "contents", "records", "open", "ready", "peak RSS", "RSS above imports", "build"],
    )
    figures: dict[tuple[str, str, int], tuple[float, float]] = {}
    for backend in backends:
        for kind in ("calls", "entries"):
            for count in sizes:
                url, built = await build.ensure(backend, kind, count, settings.cache_dir)
                runs: list[dict[str, float]] = []
                for _ in range(reps):
                    try:
                        runs.append(await measure(url, kind, count))
                    except RuntimeError:
                        if built is not None or runs:
                            raise
                        # A cached journal the current code cannot open (its format changed): rebuild once.
                        build.discard(backend, kind, count, settings.cache_dir)
                        url, built = await build.ensure(backend, kind, count, settings.cache_dir)
                        runs.append(await measure(url, kind, count))
                ready = median(r["ready_s"] for r in runs)
                peak = max(r["peak_rss"] for r in runs)
                above = median(r["peak_rss"] - r["baseline_rss"] for r in runs)
                figures[(backend, kind, count)] = (ready, peak)
                table.add(
                    backend,
                    "call records" if kind == "calls" else "process entries",
                    f"{count:,}",
                    ms(median(r["open_s"] for r in runs)),
                    ms(ready),
                    mb(peak),
                    mb(above),
                    "cached" if built is None else f"built in {built:,.0f} s",
                )
    table.notes.append(
        f"median of {reps} fresh processes; ready = open + the last call record fetched (calls) or "
        f"ReplayEngine.recover() (entries, a checkpoint every {build.CHECKPOINT_EVERY:,}); peak RSS = "
        "the child's VmHWM (its ru_maxrss would include the forked parent's), interpreter and imports included."
    )
    if settings.quick:
        table.notes.append("quick mode: the 100,000 and 1,000,000 sizes are skipped.")
    table.notes.extend(note for note in skipped_journals() if note.startswith("file"))
    result.tables.append(table)
    for backend in ("file", "sqlite"):
        name = f"Recovery of 1,000,000 call records ≤ {TARGET_SECONDS} s and ≤ 300 MB peak RSS [{backend}]"
        figure = figures.get((backend, "calls", TARGET_RECORDS))
        if figure is None:
            why = "file journal not built" if backend not in backends else "skipped (quick mode)"
            result.targets.append(Target(name, "≤ 1.5 s, ≤ 300 MB", why, None))
            continue
        ready, peak = figure
        result.targets.append(
            Target(
                name,
                "≤ 1.5 s, ≤ 300 MB",
                f"{ready:.2f} s, {peak / 1e6:,.0f} MB",
                ready <= TARGET_SECONDS and peak <= TARGET_RSS,
            )
        )
    return result
