"""One replica of the capacity case: `python -m benchmarks._capacity_child URL CALLERS SECONDS`.

An `Engine` on the Postgres journal at URL (the schema every replica shares), CALLERS tasks making
durable misses of a no-op back to back. Prints `ready`, waits for a line on stdin (so every
replica starts at once), runs for SECONDS, then prints one JSON line: calls made, seconds, and
the journal's batch counts (claims and swaps per statement); closes after one more line.
"""

from __future__ import annotations

import itertools
import os
import sys
import time

import anyio
import orjson

from mcp_durable import ToolPolicy
from mcp_durable.engine import Engine, ToolOutcome
from mcp_durable.journal.postgres import PostgresJournal


async def main(url: str, callers: int, seconds: float) -> None:
    journal = PostgresJournal.from_url(url)
    engine = Engine(journal)
    await engine.start()
    policy = ToolPolicy(idempotent=True, key="derived")
    outcome = ToolOutcome("ok", b'{"content":[{"type":"text","text":"ok"}]}', False)

    async def run(call: object) -> ToolOutcome:
        return outcome

    numbers = itertools.count(os.getpid() * 10**9)
    calls = 0
    stop = 0.0

    async def caller() -> None:
        nonlocal calls
        while time.perf_counter() < stop:
            await engine.execute(tool="noop", policy=policy, arguments={"n": next(numbers)}, meta=None, run=run)
            calls += 1

    async def burst(until: float) -> None:
        nonlocal stop
        stop = until
        async with anyio.create_task_group() as group:
            for _ in range(callers):
                group.start_soon(caller)

    await burst(time.perf_counter() + 0.5)  # warm-up: connections open, statements prepared
    print("ready", flush=True)
    await anyio.to_thread.run_sync(sys.stdin.readline)
    calls = 0
    claims, swaps = (journal._claims.batches, journal._claims.items), (journal._swaps.batches, journal._swaps.items)
    began = time.perf_counter()
    await burst(began + seconds)
    elapsed = time.perf_counter() - began
    report = {
        "calls": calls,
        "seconds": elapsed,
        "claim_statements": journal._claims.batches - claims[0],
        "claims": journal._claims.items - claims[1],
        "swap_statements": journal._swaps.batches - swaps[0],
        "swaps": journal._swaps.items - swaps[1],
    }
    print(orjson.dumps(report).decode(), flush=True)
    await anyio.to_thread.run_sync(sys.stdin.readline)  # the parent reads the database's counters first
    await engine.aclose()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
