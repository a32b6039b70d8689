"""Two `mcp-durable serve` processes on one SQLite journal: the claim is atomic across them, so
concurrent calls with one key through both servers run the tool once and all get its result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from mcp import Client

from tests.helpers import body_bytes, key_meta, serve_http
from tests.server.servers.counting import Counter

COUNTING = "tests/server/servers/counting.py:make_server"


async def test_concurrent_calls_with_one_key_through_two_server_processes_run_the_tool_once(tmp_path: Path) -> None:
    journal = f"sqlite:///{tmp_path}/journal.db"
    counter = Counter(tmp_path / "counter")
    env = {"COUNTER_FILE": str(counter.path)}
    results: list[Any] = []
    arguments = {"text": "shared", "delay": 0.5}

    async def burst(url: str, mode: str, n: int) -> None:
        async with Client(url, mode=mode) as client:

            async def one() -> None:
                results.append(await client.call_tool("slow", arguments, meta=key_meta("two-proc")))

            async with anyio.create_task_group() as tg:
                for _ in range(n):
                    tg.start_soon(one)

    async with serve_http(COUNTING, journal=journal, env=env) as a, serve_http(COUNTING, journal=journal, env=env) as b:
        async with anyio.create_task_group() as tg:
            tg.start_soon(burst, a.url, "auto", 20)
            tg.start_soon(burst, b.url, "legacy", 20)
    assert counter.count("slow") == 1
    assert len(results) == 40 and all(not result.is_error for result in results), [r for r in results if r.is_error][:1]
    assert len({body_bytes(result) for result in results}) == 1
    assert sum(1 for r in results if not (r.meta or {}).get("mcp-durable/replayed")) == 1
