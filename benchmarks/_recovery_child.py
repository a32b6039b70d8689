"""One recovery measurement in a fresh process: `python -m benchmarks._recovery_child URL KIND N`.

Prints one JSON object: `open_s` (the journal's `open()`), `ready_s` (open plus the first answer:
the last call record fetched for KIND=calls, `ReplayEngine.recover()` for KIND=entries),
`baseline_rss` (peak RSS after imports, before opening) and `peak_rss` (peak RSS at the end),
both in bytes (see `_rss`).
"""

from __future__ import annotations

import resource
import sys
import time

import anyio
import orjson

from mcp_durable.journal import create_journal
from mcp_durable.journal.processes import ReplayEngine

from .build import PROCESS, call_identity


def _rss() -> int:
    """Peak RSS of this process image, in bytes.

    Linux's `ru_maxrss` keeps the high-water mark of the process before `exec` (here the parent
    benchmark, forked), so it would report the parent's size; `VmHWM` in /proc/self/status is
    the peak of this image alone. Elsewhere, `ru_maxrss`.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


async def measure(url: str, kind: str, count: int) -> dict[str, object]:
    journal = create_journal(url)
    baseline = _rss()
    began = time.perf_counter()
    await journal.open()
    opened = time.perf_counter()
    if kind == "calls":
        record = await journal.get(call_identity(count - 1))
        if record is None or record.result is None:
            raise SystemExit(f"the journal at {url} lacks call record {count - 1}")
    else:
        process = await ReplayEngine(journal).recover(PROCESS)
        if process.last_seq < count:
            raise SystemExit(f"the journal at {url} recovered only up to seq {process.last_seq}")
    ready = time.perf_counter()
    peak = _rss()
    await journal.aclose()
    return {"open_s": opened - began, "ready_s": ready - began, "baseline_rss": baseline, "peak_rss": peak}


def main() -> None:
    url, kind, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sys.stdout.write(orjson.dumps(anyio.run(measure, url, kind, count)).decode() + "\n")


if __name__ == "__main__":
    main()
