"""A started server freezes the heap its process has then, once (mcp_durable/heap.py).

Each case runs in a fresh interpreter: the freeze is once per process, and this test process
may have started a server already.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import gc, json, sys, weakref
    import anyio
    from mcp import Client
    from mcp_durable import DurableServer
    from mcp_durable.heap import startup_heap_frozen

    class Node:
        pass

    async def main() -> None:
        freeze = sys.argv[1] == "on"
        # Garbage made before the start, in a cycle only the collector frees: it must be
        # collected before the freeze, or it would be kept for the life of the process.
        cycle = Node()
        cycle.self = cycle
        before_start = weakref.ref(cycle)
        del cycle
        gc.disable()  # no collection but the server's own between here and the start
        frozen_before = gc.get_freeze_count()
        first = DurableServer("heap-a", journal="memory://", freeze_heap=freeze)
        second = DurableServer("heap-b", journal="memory://", freeze_heap=freeze)
        async with Client(first):
            frozen_first = gc.get_freeze_count()
            cycle_collected = before_start() is None
        made_after = [Node() for _ in range(1000)]  # alive, made after the first start
        async with Client(second):
            frozen_second = gc.get_freeze_count()
        gc.enable()
        print(json.dumps({
            "before": frozen_before, "first": frozen_first, "second": frozen_second,
            "cycle_collected": cycle_collected, "flag": startup_heap_frozen(), "made_after": len(made_after),
        }))

    anyio.run(main)
    """
)


def _child(freeze: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", CHILD, freeze], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_first_start_collects_then_freezes_and_a_second_start_does_not_again() -> None:
    seen = _child("on")
    assert seen["before"] == 0
    assert isinstance(seen["first"], int) and seen["first"] > 10_000  # the imports' objects, at least
    assert seen["cycle_collected"] is True  # collected before the freeze, not kept forever
    # Once per process: the second start froze nothing more (the 1,000 objects made between the
    # two starts would have grown the frozen generation; frozen objects freed since shrink it).
    assert isinstance(seen["second"], int) and seen["second"] <= seen["first"]
    assert seen["flag"] is True


def test_freeze_heap_false_leaves_the_collector_alone() -> None:
    seen = _child("off")
    assert seen["before"] == seen["first"] == seen["second"] == 0
    assert seen["cycle_collected"] is False  # no collection ran: the cycle is still there
    assert seen["flag"] is False
