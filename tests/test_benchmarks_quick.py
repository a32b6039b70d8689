"""The benchmark suite's quick mode runs end to end (a smoke run in CI).

It fails only when the suite does — an error or a non-zero exit — never on a figure: speed is
measured in benchmarks/, never asserted in tests. With the `peers` extra installed, case 9 runs
its peers too.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_quick_benchmark_suite_runs_every_case_and_writes_its_report(tmp_path: Path) -> None:
    report = tmp_path / "benchmarks.md"
    env = {**os.environ, "MCP_DURABLE_BENCH_CACHE": str(tmp_path / "cache"), "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--output", str(report)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout[-6000:]}\nstderr:\n{done.stderr[-6000:]}"
    text = report.read_text()
    for heading in (
        "## Machine",
        "1. Sequential latency",
        "2. Throughput",
        "3. Journal appends",
        "4. Recovery",
        "5. Streamable HTTP",
        "6. Bytes on disk",
        "7. Proxy",
        "8. MCP tasks",
        "9. Peers side by side",
        "11. Journal size over time",
        "12. Scale: each operation's median",
        "12b. Scale: ready",
        "13. Retention on",
        "14. FastMCP side by side",
        "Targets",
    ):
        assert heading in text, f"the report lacks {heading!r}"


def test_the_engine_misses_harness_makes_its_misses_and_prints_a_median(tmp_path: Path) -> None:
    """`benchmarks/engine_misses.py` (the harness behind benchmarks.md's engine-alone figures)
    runs as its docstring says, with derived and with callers' keys, one caller or 64 at once,
    and its misses are real ones: each left a completed record."""
    url = f"sqlite:///{tmp_path}/journal.db"

    def harness(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "benchmarks.engine_misses", url, *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    derived = harness("40", "10")
    assert derived.returncode == 0, derived.stderr[-4000:]
    assert float(derived.stdout.strip()) > 0
    callers = harness("20", "5", "caller")
    assert callers.returncode == 0, callers.stderr[-4000:]
    with sqlite3.connect(tmp_path / "journal.db") as db:
        assert db.execute("select count(*) from calls where tool = 'noop' and state = 'completed'").fetchone() == (60,)
        callers_keys = db.execute("select count(*) from calls where key like 'k%'").fetchone()
        assert callers_keys == (20,)  # the caller's keys, not keys derived from the arguments
    concurrent = harness("130", "30", "caller", "64")
    assert concurrent.returncode == 0, concurrent.stderr[-4000:]
    assert float(concurrent.stdout.strip()) > 0
    with sqlite3.connect(tmp_path / "journal.db") as db:
        assert db.execute("select count(*) from calls where tool = 'noop' and state = 'completed'").fetchone() == (190,)
    refused = harness("10", "10")
    assert refused.returncode != 0 and "WARM < N" in refused.stderr
