"""Case 5: streamable HTTP end to end — uvicorn in its own process, 16 concurrent MCP clients.

Each client is a real MCP `Client` over streamable HTTP (its own connection, 2026-07-28 era
negotiated as usual); they call the no-op tool back to back until the run's quota is done.
Plain versus durable misses (a new key per call) and durable replays, per journal (file when
built, SQLite, Postgres when a server answers), at default durability. The server runs in a
separate process, so on this 2-core machine server and clients each get about a core. The plain
server stays up throughout and is measured in every repetition beside each durable server, so
each ratio compares runs made side by side.
"""

from __future__ import annotations

import itertools
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
from anyio.abc import Process
from mcp import Client

from .common import (
    CaseResult,
    Settings,
    Table,
    Target,
    in_turn,
    journal_urls,
    median,
    rate,
    ratio,
    skipped_journals,
    us,
)
from .cpu import CpuMeter
from .servers import TOOL
from .timing import check_result, fresh_arguments

CLIENTS = 16
#: Bars of the durable miss over HTTP, against plain (issue 15); the file journal is shown unjudged.
TARGET_RATIOS = {"sqlite": 0.80, "postgres": 0.80}

# httpx logs every request at INFO, and the SDK's server constructor sets the root logger to
# INFO (through rich): thousands of lines rendered by the measuring process, on the same two
# cores as the server it measures.
logging.getLogger("httpx").setLevel(logging.WARNING)
#: The 2025-11-25 era (sessions, `initialize`): what deployed clients speak over HTTP today (the
#: TypeScript SDK, the Inspector). The SDK's 2026-07-28 HTTP client in 2.3.0 takes ~40 ms per call
#: here whatever the server does (a client-side wait), which would hide the server's cost.
MODE = "legacy"
ROOT = Path(__file__).resolve().parent.parent


@asynccontextmanager
async def http_server(*args: str) -> AsyncIterator[tuple[str, int]]:
    """Run `benchmarks._http_server` with `args`; yield its MCP URL and process id; kill it afterwards."""
    process: Process = await anyio.open_process(
        [sys.executable, "-m", "benchmarks._http_server", *args], cwd=ROOT, stderr=None
    )
    try:
        assert process.stdout is not None
        line = b""
        with anyio.fail_after(30):
            while not line.endswith(b"\n"):
                chunk = await process.stdout.receive(1)
                line += chunk
        port = int(line.decode().split()[1])
        yield f"http://127.0.0.1:{port}/mcp", process.pid
    finally:
        process.terminate()
        with anyio.move_on_after(10):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


async def _rate(clients: list[Client], args: Callable[[], dict[str, int]], total: int) -> float:
    remaining = total

    async def caller(client: Client) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            check_result(await client.call_tool(TOOL, args()))

    began = time.perf_counter()
    async with anyio.create_task_group() as group:
        for client in clients:
            group.start_soon(caller, client)
    return total / (time.perf_counter() - began)


async def _clients(stack: AsyncExitStack, url: str) -> list[Client]:
    return [await stack.enter_async_context(Client(url, mode=MODE)) for _ in range(CLIENTS)]


async def _console_cost(settings: Settings, kind: str, total: int) -> tuple[float, float, list[float]]:
    """Misses/s of the durable server without and with the console mounted (nobody looking at it),
    and the per-pair ratios. Both servers run at once, each on its own fresh journal, and are
    measured alternately (ABBA), so a change of the machine's load touches both sides of a pair."""
    pairs = settings.pick(4, 8)
    fresh = fresh_arguments(itertools.count(1))
    async with AsyncExitStack() as stack:
        urls = [
            (await stack.enter_async_context(http_server(server, journal_urls(settings, memory=False)[kind])))[0]
            for server in ("durable", "console")
        ]
        sides = [[await stack.enter_async_context(Client(url, mode=MODE)) for _ in range(CLIENTS)] for url in urls]
        for clients in sides:
            await _rate(clients, fresh, 2 * CLIENTS)  # warm-up
        rates: list[list[float]] = [[], []]
        for pair in range(pairs):
            for side in in_turn((0, 1), pair):
                rates[side].append(await _rate(sides[side], fresh, total))
    ratios = [b / a for a, b in zip(rates[0], rates[1], strict=True)]
    return median(rates[0]), median(rates[1]), ratios


async def run(settings: Settings) -> CaseResult:
    result = CaseResult("http")
    total = settings.pick(48, 480)
    # Five repetitions (three let one swing of this 2-core machine decide a verdict: the same code's
    # Postgres miss ratio read 0.71x, 0.74x and 0.81x in three runs), in alternating order.
    reps = settings.pick(1, 5)
    urls = {k: v for k, v in journal_urls(settings, memory=False).items() if k in ("file", "sqlite", "postgres")}
    table = Table(
        f"5. Streamable HTTP end to end: requests per second, {CLIENTS} concurrent clients",
        ["server", "requests/s", "/ plain", "CPU per call: clients", "server", "Postgres", "idle cores"],
    )
    plain_all: list[float] = []
    rows: list[tuple[str, str, float, float, CpuMeter]] = []  # journal, kind, rate, plain rate beside it, CPU
    async with http_server("plain") as (plain_url, plain_pid), AsyncExitStack() as plain_stack:
        plain_cpu = CpuMeter(plain_pid)
        plain_clients = await _clients(plain_stack, plain_url)
        await _rate(plain_clients, lambda: {"n": 1}, 2 * CLIENTS)  # warm-up
        for name, journal in urls.items():
            counter = itertools.count(1)
            variants = {"miss": fresh_arguments(counter), "replay": lambda: {"n": 0}}
            rates: dict[str, list[float]] = {}
            async with http_server("durable", journal) as (url, pid), AsyncExitStack() as stack:
                meters = {"plain": plain_cpu, **{kind: CpuMeter(pid) for kind in variants}}
                clients = await _clients(stack, url)
                for args in variants.values():
                    await _rate(clients, args, 2 * CLIENTS)  # warm-up (and the replayed call's first run)
                sides = [("plain", plain_clients, lambda: {"n": 1})]
                sides += [(kind, clients, args) for kind, args in variants.items()]
                for rep in range(reps):
                    # plain first in even repetitions, last in odd ones: a drift of the machine's
                    # speed within a repetition falls on both sides alike
                    for kind, side, args in sides if rep % 2 == 0 else sides[1:] + sides[:1]:
                        with meters[kind]:
                            rates.setdefault(kind, []).append(await _rate(side, args, total))
                        meters[kind].count(total)
            plain_all.extend(rates["plain"])
            for kind in variants:
                rows.append((name, kind, median(rates[kind]), median(rates["plain"]), meters[kind]))
    table.add("plain MCPServer", rate(median(plain_all)), ratio(1.0), *_cpu_cells(plain_cpu))
    for name, kind, value, plain, meter in rows:
        table.add(f"durable, {name} journal, {kind}", rate(value), ratio(value / plain), *_cpu_cells(meter))
        bar = TARGET_RATIOS.get(name)
        if kind == "miss" and bar is not None:
            result.targets.append(
                Target(
                    f"HTTP miss at {CLIENTS} clients ≥ {bar}× plain [{name}]",
                    f"≥ {bar:.2f}x",
                    f"{ratio(value / plain)} ({rate(value)} vs {rate(plain)})",
                    value / plain >= bar,
                )
            )
    # The console mounted and nobody looking, against the same server without it (the first journal).
    first = next(iter(urls), None)
    if first is not None:
        without, with_console, ratios = await _console_cost(settings, first, total)
        table.add(
            f"durable, {first} journal, miss, console mounted",
            rate(with_console),
            ratio(with_console / without),
            *["–"] * 4,
        )
        table.notes.append(
            f"console mounted, nobody looking: {median(ratios):.2f}x the misses of the same server without it "
            f"(median of {len(ratios)} alternating pairs, both servers up at once: {rate(with_console)} "
            f"against {rate(without)}; ratios {', '.join(f'{r:.2f}' for r in ratios)}); its '/ plain' column "
            "is against that server without the console"
        )
    table.notes.append(
        f"uvicorn in a separate process; {total:,} calls per measurement, median of {reps}; the plain server "
        "is measured in every repetition beside each durable one and each ratio is against those plain runs; "
        "miss = a new key per call (fsync on), replay = one key repeated. Both servers freeze their "
        "start-up heap once built, as `mcp-durable serve` does."
    )
    table.notes.append(
        "CPU per call (from /proc, over every repetition): the clients' process, the server's, and the local "
        "Postgres's processes (a diagnosis, not judged); idle cores: how many of the machine's cores were idle on "
        "average while measuring. A row under its bar with cores idle is waiting, not short of CPU: its "
        'calls wait on commits while the clients have nothing to send (docs/dev/performance-notebook.md, "Streamable '
        'HTTP on Postgres: waiting, not short of CPU").'
    )
    table.notes.extend(skipped_journals())
    result.tables.append(table)
    return result


def _cpu_cells(meter: CpuMeter) -> list[str]:
    """The CPU columns of one row: clients, server, Postgres per call, and idle cores."""
    per_call, idle = meter.per_call(), meter.idle_cores()
    cells = ["–", "–", "–"] if per_call is None else [us(seconds) for seconds in per_call]
    return [*cells, "–" if idle is None else f"{idle:.2f}"]
