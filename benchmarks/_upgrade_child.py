"""The processes of the upgrade trial (`benchmarks/upgrade.py`), run by path with either tree first
on `PYTHONPATH`: `build BACKEND N CACHE` and `write URL CALLERS` with the earlier release's tree,
`open URL N` with this one. Each prints one JSON line (`write` prints `ready` first and stops at
a line on stdin).

Written against what both releases have (`create_journal`, `Engine.execute`, `ToolPolicy`,
`benchmarks.build` and `benchmarks.common.PG_BASE`), so it runs on either.
"""

from __future__ import annotations

import itertools
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import orjson

# Imported from the tree on `PYTHONPATH` (this file is run by path, not as a module of it).
from benchmarks import build as built_journals
from benchmarks.common import PG_BASE


async def build(backend: str, count: int, cache: Path) -> dict[str, Any]:
    """A journal of `count` COMPLETED records as the release on `PYTHONPATH` writes them."""
    began = time.perf_counter()
    if backend == "postgres":
        import psycopg

        schema = f"upgrade_old_{count}"
        with psycopg.connect(PG_BASE, autocommit=True) as conn:
            if conn.execute(
                "SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = 'calls'", (schema,)
            ).fetchone():
                row = conn.execute(f'SELECT count(*) FROM "{schema}".calls').fetchone()
                if row is not None and row[0] == count:  # built before
                    return {"source": schema, "seconds": 0.0}
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await built_journals._build_api(f"{PG_BASE}?schema={schema}", "calls", count)
        return {"source": schema, "seconds": time.perf_counter() - began}
    url, _ = await built_journals.ensure(backend, "calls", count, cache)
    root = url.split("://", 1)[1].lstrip("/")
    return {"source": str(Path("/" + root).parent), "seconds": time.perf_counter() - began}


async def open_journal(url: str, count: int) -> dict[str, Any]:
    """Open (and so migrate) with the release on `PYTHONPATH`, then read the last built record."""
    from mcp_durable.journal import create_journal

    began = time.perf_counter()
    journal = create_journal(url)
    await journal.open()
    opened = time.perf_counter()
    record = await journal.get(built_journals.call_identity(count - 1))
    ready = time.perf_counter()
    applied = getattr(journal, "migrations_applied", None)
    await journal.aclose()
    if record is None:
        raise SystemExit(f"the last built record is missing from {url}")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"open_s": opened - began, "ready_s": ready - began, "peak_rss": rss, "applied": applied}


async def write(url: str, callers: int) -> dict[str, Any]:
    """`callers` durable misses back to back until a line on stdin: the longest call, errors."""
    from mcp_durable import ToolPolicy
    from mcp_durable.engine import Engine, ToolOutcome
    from mcp_durable.errors import DurableError
    from mcp_durable.journal import create_journal

    engine = Engine(create_journal(url))
    await engine.start()
    policy = ToolPolicy(idempotent=True)
    outcome = ToolOutcome("ok", b'{"content":[{"type":"text","text":"ok"}]}', False)

    async def run(call: object) -> ToolOutcome:
        return outcome

    numbers = itertools.count(os.getpid() * 10**9)
    times: list[float] = []
    errors: list[str] = []
    stop = False

    async def caller() -> None:
        while not stop:
            began = time.perf_counter()
            try:
                await engine.execute(tool="written", policy=policy, arguments={"n": next(numbers)}, meta=None, run=run)
            except DurableError as exc:  # what the earlier release's callers would see
                errors.append(repr(exc)[:300])
                await anyio.sleep(0.05)
            times.append(time.perf_counter() - began)

    async with anyio.create_task_group() as group:
        for _ in range(callers):
            group.start_soon(caller)
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        stop = True
    await engine.aclose()
    return {"calls": len(times), "longest_s": max(times, default=0.0), "errors": len(errors), "first_error": errors[:1]}


def main() -> None:
    command, args = sys.argv[1], sys.argv[2:]
    if command == "build":
        report = anyio.run(build, args[0], int(args[1]), Path(args[2]))
    elif command == "open":
        report = anyio.run(open_journal, args[0], int(args[1]))
    elif command == "write":
        report = anyio.run(write, args[0], int(args[1]))
    else:
        raise SystemExit(f"unknown command {command!r}")
    print(orjson.dumps(report).decode(), flush=True)


if __name__ == "__main__":
    main()
