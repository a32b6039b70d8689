"""Case 10: how many durable calls one Postgres carries for N replica processes.

N processes (1, 2, 4), each an engine on the same Postgres schema with 64 callers making durable
misses of a no-op (no MCP stack: the database's share is what is measured), started together and
run for the same seconds. Reported: the calls per second of all replicas together, per replica,
the calls per statement their batches reached, and the commits Postgres made per call (from
`pg_stat_database`, so other users of the same server add to it). docs/deployment.md turns these
into a capacity model.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import orjson

from .common import PG_BASE, CaseResult, Settings, Table, postgres_available, postgres_url, rate, us
from .cpu import postgres_cpu

ROOT = Path(__file__).resolve().parent.parent
CALLERS = 64


def _commits() -> int:
    import psycopg

    with psycopg.connect(PG_BASE, connect_timeout=5, autocommit=True) as conn:
        row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()
    return int(row[0]) if row else 0


def _run_replicas(url: str, replicas: int, seconds: float) -> tuple[list[dict[str, float]], int, float | None]:
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks._capacity_child", url, str(CALLERS), str(seconds)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(replicas)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            line = child.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"a replica did not start: {line!r}")
        before, cpu_before = _commits(), postgres_cpu()
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        reports = []
        for child in children:
            assert child.stdout is not None
            reports.append(orjson.loads(child.stdout.readline()))
        # Read while every replica's connections are still open (a closed backend's CPU is gone).
        commits, cpu_after = _commits() - before, postgres_cpu()
        for child in children:
            child.communicate("bye\n", timeout=60)
        cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
        return reports, commits, cpu
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()


async def run(settings: Settings) -> CaseResult:
    result = CaseResult("capacity")
    table = Table(
        "10. Capacity: durable misses one Postgres carries for N replica processes (engine only, 64 callers each)",
        [
            "replicas",
            "calls/s, all",
            "calls/s per replica",
            "calls per claim statement",
            "calls per swap statement",
            "commits per call",
            "Postgres CPU per call",
        ],
    )
    if not postgres_available():
        table.add("–", "no Postgres at " + PG_BASE, "", "", "", "", "")
        result.tables.append(table)
        return result
    seconds = float(settings.pick(1, 10))
    for replicas in (1, 2, 4):
        url = postgres_url()
        reports, commits, cpu = await anyio.to_thread.run_sync(_run_replicas, url, replicas, seconds)
        calls = sum(r["calls"] for r in reports)
        total = sum(r["calls"] / r["seconds"] for r in reports)
        per_claim = sum(r["claims"] for r in reports) / max(1, sum(r["claim_statements"] for r in reports))
        per_swap = sum(r["swaps"] for r in reports) / max(1, sum(r["swap_statements"] for r in reports))
        table.add(
            replicas,
            rate(total),
            rate(total / replicas),
            f"{per_claim:.1f}",
            f"{per_swap:.1f}",
            f"{commits / max(1, calls):.3f}",
            "–" if cpu is None else us(cpu / max(1, calls)),
        )
    table.notes.append(
        f"{seconds:g} s per row, every replica started at once on one schema; each call is a claim and a "
        "completion (two statements, batched with the replica's other calls). Postgres and the replicas share "
        "this machine's cores, so the figure is a floor for a database on its own host; commits per call counts "
        "every commit of the database in the window (other users included), and Postgres CPU per call the CPU "
        "time of every local postgres process in it (likewise)."
    )
    result.tables.append(table)
    return result
