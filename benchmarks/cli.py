"""`python -m benchmarks.cli [--runs N]`: how long `mcp-durable journal stats` takes, start to exit.

Not a case of the suite (it times a process start, not the engine): it builds a file journal
with a few records in a temporary folder, runs `mcp-durable journal stats --journal URL` N times
as a fresh process (`python -m mcp_durable.cli`, the console script's entry point) and prints
the median, the quartiles and, for the record, which `mcp_durable.server*` modules that
process loaded (none is the goal: issue 17). docs/dev/performance-notebook.md keeps the figures
("The operator CLI starts without the MCP face").
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

from mcp_durable.journal import CallIdentity, CallRecord, CallState, create_journal

LOADED = (
    "import sys, mcp_durable.cli as c; rc = c.main(sys.argv[1:]);"
    "print(sorted(m for m in sys.modules if m.startswith('mcp_durable.server')), file=sys.stderr)"
)


async def _fill(url: str, records: int) -> None:
    journal = create_journal(url)
    await journal.open()
    try:
        for n in range(records):
            now = time.time()
            record = CallRecord(
                identity=CallIdentity("local", "refund", f"k{n}"),
                fingerprint="f",
                state=CallState.PENDING,
                version=1,
                run_id=f"r{n}",
                attempts=1,
                created_at=now,
                updated_at=now,
                owner="bench",
                lease_until=now + 60,
            )
            await journal.claim(record, now)
    finally:
        await journal.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cli", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--records", type=int, default=100)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        url = f"file://{Path(folder) / 'journal'}"
        anyio.run(_fill, url, args.records)
        command = [sys.executable, "-m", "mcp_durable.cli", "journal", "stats", "--journal", url]
        subprocess.run(command, check=True, capture_output=True)  # warm the page cache
        times = []
        for _ in range(args.runs):
            started = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            times.append(time.perf_counter() - started)
        probe = subprocess.run(
            [sys.executable, "-c", LOADED, "journal", "stats", "--journal", url],
            check=True,
            capture_output=True,
            text=True,
        )
    q1, median, q3 = statistics.quantiles(times, n=4)
    print(f"mcp-durable journal stats ({args.runs} runs, {args.records} records, file journal)")
    print(f"  median {median * 1000:.0f} ms   quartiles {q1 * 1000:.0f}–{q3 * 1000:.0f} ms")
    print(f"  mcp_durable.server modules loaded: {probe.stderr.strip().splitlines()[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
