"""Claim + complete round trips per second on the Postgres journal (a script, not a test).

    .venv/bin/python -m benchmarks.postgres_claims [--seconds 5] [--url postgresql://…]

Each caller loops: `claim` a new key (one INSERT … ON CONFLICT statement), then `swap` it to
COMPLETED (one UPDATE … WHERE version, whose trigger sends the NOTIFY): the journal's whole
cost of a first call. Every statement is its own committed (durable) transaction. Measured
with 1 and 64 concurrent callers, and for 64 with pool sizes 10 (the default) and 64. Prints
one line per configuration; nothing is asserted. The schema is dropped afterwards.
"""

from __future__ import annotations

import argparse
import time
import uuid

import anyio
import psycopg

from mcp_durable.journal import CallIdentity, CallRecord, CallState, create_journal

T0 = 1_700_000_000.0


async def measure(url: str, callers: int, seconds: float) -> tuple[float, float]:
    """(round trips per second, median latency in ms) of `callers` looping for `seconds`."""
    journal = create_journal(url)
    await journal.open()
    done = 0
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def caller(n: int) -> None:
        nonlocal done
        i = 0
        while time.perf_counter() < stop_at:
            i += 1
            began = time.perf_counter()
            record = CallRecord(
                identity=CallIdentity("bench", "noop", f"{n}-{i}-{uuid.uuid4().hex[:6]}"),
                fingerprint="f",
                state=CallState.PENDING,
                version=1,
                run_id=uuid.uuid4().hex,
                attempts=1,
                created_at=T0,
                updated_at=T0,
                owner="bench",
                lease_until=T0 + 30,
            )
            won, _ = await journal.claim(record, T0)
            assert won
            assert await journal.swap(1, record.evolve(state=CallState.COMPLETED, result=b'{"content":[]}'))
            latencies.append(time.perf_counter() - began)
            done += 1

    began = time.perf_counter()
    try:
        async with anyio.create_task_group() as tg:
            for n in range(callers):
                tg.start_soon(caller, n)
    finally:
        await journal.aclose()
    latencies.sort()
    return done / (time.perf_counter() - began), latencies[len(latencies) // 2] * 1000


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    sep = "&" if "?" in args.url else "?"
    try:
        for callers, pool_max in ((1, 10), (64, 10), (64, 64)):
            url = f"{args.url}{sep}schema={schema}&pool_max={pool_max}"
            per_s, p50 = await measure(url, callers, args.seconds)
            print(f"callers={callers:3d} pool_max={pool_max:3d}: {per_s:8.0f} claim+complete/s, p50 {p50:6.2f} ms")
    finally:
        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    anyio.run(main)
