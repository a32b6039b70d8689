"""An engine never mistakes its own call for a dead owner's, at any point of the call.

A PENDING record this engine owns is alive exactly while the engine is inside that call: from
the claim (or take-over) being sent until the outcome is persisted. Duplicates arriving in
the moments between — the claim committed but its coroutine not yet resumed, or the tool done
and its result still being written — must wait for it, not mark it in doubt and run it again.
Those moments only open on a journal whose writes yield to the event loop, so this runs on
every real backend (the memory journal's writes never yield; it runs too, as a control).
"""

from __future__ import annotations

import random
from collections import Counter

import anyio

from mcp_durable import Engine, ToolOutcome, ToolPolicy
from mcp_durable.engine import Runner
from mcp_durable.journal import CallQuery, CallState, Journal

KEY_META = "mcp-durable/idempotency-key"


async def test_duplicates_arriving_at_every_moment_of_a_call_never_run_it_twice(journal: Journal) -> None:
    engine = Engine(journal)
    runs: Counter[str] = Counter()
    errors: list[BaseException] = []

    def tool_for(key: str) -> Runner:
        async def run(_call: object) -> ToolOutcome:
            runs[key] += 1
            return ToolOutcome(key, b'{"content":[]}', is_error=False)

        return run

    async def call(key: str, delay: float) -> None:
        await anyio.sleep(delay)
        try:
            await engine.execute(
                tool="refund", policy=ToolPolicy(), arguments={"order": key}, meta={KEY_META: key}, run=tool_for(key)
            )
        except Exception as exc:  # noqa: BLE001 - collected: every call must succeed
            errors.append(exc)

    # Each key's 12 calls are spread over a few milliseconds, so some of them read the record
    # while the first call's claim or its persist is still on its way to the journal.
    rng = random.Random(11)
    keys = [f"key-{i:02d}" for i in range(40)]
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for key in keys:
                for _ in range(12):
                    tg.start_soon(call, key, rng.uniform(0, 0.02))

    assert errors == []
    assert runs == Counter({key: 1 for key in keys})
    records = await journal.list_calls(CallQuery(limit=1000))
    assert sorted((r.identity.key, r.state, r.attempts) for r in records) == [
        (key, CallState.COMPLETED, 1) for key in keys
    ]
    await engine.aclose()
