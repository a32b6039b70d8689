"""Misses through an engine alone: `python -m benchmarks.engine_misses URL [N] [WARM] [KEYS] [CALLERS]`.

An `Engine` on the journal at URL makes N durable misses of a no-op one after another (new
arguments each time; KEYS `derived`, the default: the key derived from them, or `caller`: a
caller's key in `_meta`, which trees older than `key="derived"` also take) and prints the median
seconds per miss after the first WARM, in microseconds. With CALLERS (1 by default) above 1,
that many tasks make the misses at once, each its share of the first WARM and then of the
rest, and what is printed is the wall time of the rest divided by their number (the inverse of
the throughput).

No MCP client or server: what a change to the engine or a journal costs a miss, measured
without the SDK's share. For two trees side by side, run it in fresh processes with
`PYTHONPATH` set to each tree in turn (alternating, order flipped each pair), or under
`valgrind --tool=callgrind` at two values of N: the difference in instructions divided by the
difference in N is a miss's count, independent of the machine's load. Run this file by its
path from a directory outside both trees: `python -m` puts the working directory first on
`sys.path`, so from a tree's root it imports that tree's `mcp_durable` whatever `PYTHONPATH`
says.
"""

from __future__ import annotations

import itertools
import statistics
import sys
import time

import anyio

from mcp_durable import ToolPolicy
from mcp_durable.engine import Engine, ToolOutcome
from mcp_durable.journal import create_journal
from mcp_durable.keys import KEY_META
from mcp_durable.steps import DurableCall

OUTCOME = ToolOutcome("ok", b'{"content":[{"type":"text","text":"ok"}]}', False)


async def run(call: DurableCall | None) -> ToolOutcome:
    return OUTCOME


async def measure(url: str, n: int, warm: int, keys: str = "derived", callers: int = 1) -> float:
    """The median seconds per miss of misses `warm + 1 … n` on a journal at `url` (with
    `callers` above 1: their wall time divided by their number, made by that many tasks)."""
    engine = Engine(create_journal(url))
    await engine.start()
    caller_keys = keys == "caller"
    policy = ToolPolicy(idempotent=True, key="auto" if caller_keys else "derived")
    numbers = itertools.count(time.time_ns())  # never a key an earlier run left in the journal
    times: list[float] = []

    async def miss() -> None:
        number = next(numbers)
        meta = {KEY_META: f"k{number}"} if caller_keys else None
        await engine.execute(tool="noop", policy=policy, arguments={"n": number}, meta=meta, run=run)

    async def wave(count: int) -> None:
        async def caller(share: int) -> None:
            for _ in range(share):
                await miss()

        async with anyio.create_task_group() as tasks:
            for i in range(callers):
                tasks.start_soon(caller, count // callers + (i < count % callers))

    try:
        if callers > 1:
            await wave(warm)
            began = time.perf_counter()
            await wave(n - warm)
            return (time.perf_counter() - began) / (n - warm)
        for _ in range(n):
            began = time.perf_counter()
            await miss()
            times.append(time.perf_counter() - began)
    finally:
        await engine.aclose()
    return statistics.median(times[warm:])


def main() -> None:
    url = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 2300
    warm = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    keys = sys.argv[4] if len(sys.argv) > 4 else "derived"
    callers = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    if not 0 <= warm < n or keys not in ("derived", "caller") or callers < 1:
        raise SystemExit(
            "usage: python -m benchmarks.engine_misses URL [N] [WARM] [derived|caller] [CALLERS], "
            "with 0 <= WARM < N and CALLERS >= 1"
        )
    print(f"{anyio.run(measure, url, n, warm, keys, callers) * 1e6:.1f}")


if __name__ == "__main__":
    main()
