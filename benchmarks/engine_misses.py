"""Sequential misses through an engine alone: `python -m benchmarks.engine_misses URL [N] [WARM]`.

An `Engine` on the journal at URL makes N durable misses of a no-op one after another (a derived
key, new arguments each time) and prints the median seconds per miss after the first WARM, in
microseconds. No MCP client or server: what a change to the engine or a journal costs a miss,
measured without the SDK's share. For two trees side by side, run it in fresh processes with
`PYTHONPATH` set to each tree in turn (alternating, order flipped each pair), or under
`valgrind --tool=callgrind` at two values of N: the difference in instructions divided by the
difference in N is a miss's count, independent of the machine's load.
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
from mcp_durable.steps import DurableCall

OUTCOME = ToolOutcome("ok", b'{"content":[{"type":"text","text":"ok"}]}', False)


async def run(call: DurableCall | None) -> ToolOutcome:
    return OUTCOME


async def measure(url: str, n: int, warm: int) -> float:
    """The median seconds per miss of misses `warm + 1 … n` on a journal at `url`."""
    engine = Engine(create_journal(url))
    await engine.start()
    policy = ToolPolicy(idempotent=True, key="derived")
    numbers = itertools.count(time.time_ns())  # never a key an earlier run left in the journal
    times: list[float] = []
    try:
        for _ in range(n):
            began = time.perf_counter()
            await engine.execute(tool="noop", policy=policy, arguments={"n": next(numbers)}, meta=None, run=run)
            times.append(time.perf_counter() - began)
    finally:
        await engine.aclose()
    return statistics.median(times[warm:])


def main() -> None:
    url = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 2300
    warm = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    if not 0 <= warm < n:
        raise SystemExit("usage: python -m benchmarks.engine_misses URL [N] [WARM], with 0 <= WARM < N")
    print(f"{anyio.run(measure, url, n, warm) * 1e6:.1f}")


if __name__ == "__main__":
    main()
