"""Case 2: throughput with 1, 16, 64 and 256 concurrent callers, plain versus durable misses.

Callers are tasks sharing one in-memory client (2026-07-28 era) per server, each calling the
no-op tool back to back until the run's quota of calls is done; every durable call is a miss
(a new key), so every call claims and persists with the journal's default (fsync-on)
durability. Journals are measured one at a time, each interleaved with the plain server (so
the memory journal's records, kept in the process, do not slow another journal's garbage
collections), plain first and durable first in turn; each cell is the median rate.
"""

from __future__ import annotations

import gc
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import anyio
from mcp import Client

from .common import (
    CaseResult,
    GcMeter,
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
from .servers import SLEPT, TOOL, WAIT_S, durable_server, durable_waiting_server, plain_server, plain_waiting_server
from .timing import check_result, fresh_arguments

CONCURRENCY = (1, 16, 64, 256)
TARGET_CONCURRENCY = 64
#: The bar of each journal's miss throughput at `TARGET_CONCURRENCY` callers, against plain.
TARGET_RATIOS = {"memory": 0.85, "file": 0.70, "sqlite": 0.40, "postgres": 0.50}


async def _burst(
    call: Callable[..., Awaitable[Any]], args: Callable[[], dict[str, int]], callers: int, total: int
) -> float:
    """Calls per second of `total` calls made by `callers` concurrent tasks."""
    remaining = total

    async def caller() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            check_result(await call(TOOL, args()))

    began = time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(callers):
            group.start_soon(caller)
    return total / (time.perf_counter() - began)


async def run(settings: Settings) -> CaseResult:
    result = CaseResult("throughput")
    reps = settings.pick(1, 3)
    # The targets are read at TARGET_CONCURRENCY: more repetitions there, as a single repetition
    # swung by 0.15 and more of the ratio on this machine (where the collector's full collections land,
    # the host's speed drifting between a plain burst and the durable one beside it).
    target_reps = settings.pick(1, 5)
    urls = journal_urls(settings)
    rates: dict[tuple[int, str], list[float]] = {}  # (callers, journal or "plain:<journal>")
    gc_meters: dict[str, GcMeter] = {}  # at the target concurrency, per variant
    gc_time: dict[str, float] = {}

    async def measure(
        key: str, callers: int, call: Callable[..., Awaitable[Any]], args: Callable[[], dict[str, int]], total: int
    ) -> None:
        if callers != TARGET_CONCURRENCY:
            rates.setdefault((callers, key), []).append(await _burst(call, args, callers, total))
            return
        gc_key = "plain" if key.startswith("plain:") else key
        began = time.perf_counter()
        with gc_meters.setdefault(gc_key, GcMeter()):
            rates.setdefault((callers, key), []).append(await _burst(call, args, callers, total))
        gc_time[gc_key] = gc_time.get(gc_key, 0.0) + time.perf_counter() - began

    # One journal at a time, each interleaved with the plain server: side by side in one process,
    # but no journal's records (the memory journal keeps every one) weigh on another's garbage
    # collections. The journal's server is dropped and the heap collected before the next.
    async with Client(plain_server()) as plain:
        await _burst(plain.call_tool, lambda: {"n": 1}, 8, 32)  # warm-up
        for name, url in urls.items():
            async with Client(durable_server(url)) as client:
                durable_args = fresh_arguments(itertools.count(1))
                await _burst(client.call_tool, durable_args, 8, 32)  # warm-up
                for callers in CONCURRENCY:
                    total = max(settings.pick(32, 2000), settings.pick(1, 2) * callers)
                    for rep in range(target_reps if callers == TARGET_CONCURRENCY else reps):
                        pair = [
                            (f"plain:{name}", plain.call_tool, lambda: {"n": 1}),
                            (name, client.call_tool, durable_args),
                        ]
                        # A durable burst leaves the collector more debt (survivors promoted, a
                        # full collection falling due): in a fixed order plain would always follow
                        # durable and pay for it. (In a five-server script a plain burst after a
                        # durable one cost ~10% more CPU; in this case's runs the two orders gave
                        # the same ratios within their noise: docs/dev/performance-notebook.md,
                        # "Reading the runs of 2026-12-02 11:14 and 11:53 UTC".)
                        for key, call, args in in_turn(pair, rep):
                            await measure(key, callers, call, args, total)
            gc.collect()

    names = list(urls)
    table = Table(
        "2. Throughput, concurrent callers on one in-memory client (2026-07-28), durable = misses",
        ["callers", "plain", *[f"{n}" for n in names], *[f"{n} / plain" for n in names]],
    )
    table.notes.append(
        f"one journal at a time, each interleaved with the plain server ({reps} repetitions, {target_reps} at "
        f"{TARGET_CONCURRENCY} callers, plain first and durable first in turn; medians); "
        f"each repetition makes max({settings.pick(32, 2000)}, {settings.pick(1, 2)} × callers) calls; default "
        "durability (fsync on). The plain column is the median over all of them; each ratio is against the plain "
        "runs interleaved with that journal's."
    )
    table.notes.extend(skipped_journals())
    if gc_meters:
        shares = ", ".join(
            f"{name} {gc_meters[name].seconds / gc_time[name]:.0%} ({gc_meters[name].full} full)"
            for name in ["plain", *names]
            if name in gc_meters
        )
        table.notes.append(
            f"share of the run the garbage collector took at {TARGET_CONCURRENCY} callers (full collections): "
            f"{shares}. Durable calls wait for their fsync with their request state alive, so more of it "
            "reaches the oldest generation and whole-heap collections come more often."
        )

    def plain_of(callers: int, name: str) -> float:
        return median(rates[(callers, f"plain:{name}")])

    for callers in CONCURRENCY:
        all_plain = median([r for n in names for r in rates[(callers, f"plain:{n}")]])
        durable = [median(rates[(callers, n)]) for n in names]
        table.add(
            callers,
            rate(all_plain),
            *[rate(r) for r in durable],
            *[ratio(r / plain_of(callers, n)) for r, n in zip(durable, names, strict=True)],
        )
    result.tables.append(table)
    result.tables.append(await _waiting_control(settings, reps))
    # Every journal has its bar (issue 15): memory measures the engine's own cost, the others
    # add their storage (group commit on file and SQLite, batched statements on Postgres).
    for name in names:
        bar = TARGET_RATIOS[name]
        plain_rate = plain_of(TARGET_CONCURRENCY, name)
        r = median(rates[(TARGET_CONCURRENCY, name)]) / plain_rate
        result.targets.append(
            Target(
                f"Miss throughput at {TARGET_CONCURRENCY} callers ≥ {bar}× plain [{name}]",
                f"≥ {bar:.2f}x",
                f"{ratio(r)} ({rate(median(rates[(TARGET_CONCURRENCY, name)]))} vs {rate(plain_rate)})",
                r >= bar,
            )
        )
    return result


async def _waiting_control(settings: Settings, reps: int) -> Table:
    """The collector's share when the tool itself waits, plain and durable (memory journal).

    A durable miss on the file, SQLite or Postgres journal waits for its storage twice, with the
    request's whole state alive; the no-op of the plain server never waits. This control gives
    both servers a tool that sleeps (asking for about one journal sync; `servers.SLEPT` says how
    long it lasted), to tell what the collector costs any call that waits from what the durable
    layer adds.
    """
    table = Table(
        f"2b. Control: a tool that sleeps (asks for {WAIT_S * 1e6:.0f} µs), {TARGET_CONCURRENCY} callers "
        "(in-memory client, 2026-07-28)",
        [
            "server",
            "tool",
            "calls/s",
            "/ plain, same tool",
            "collector's share",
            "young / middle / full collections per 1,000 calls",
        ],
    )
    total = settings.pick(64, 2000)
    variants: list[tuple[str, str, Any, Callable[[], dict[str, int]]]] = [
        ("plain", "no-op", plain_server(), lambda: {"n": 1}),
        ("plain", "waits", plain_waiting_server(), lambda: {"n": 1}),
        ("durable (memory)", "waits", durable_waiting_server("memory://"), fresh_arguments(itertools.count(1))),
    ]
    rates: dict[int, list[float]] = {}
    meters = [GcMeter() for _ in variants]
    seconds = [0.0] * len(variants)
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(Client(server)) for _, _, server, _ in variants]
        for client, (_, _, _, args) in zip(clients, variants, strict=True):
            await _burst(client.call_tool, args, 8, 32)  # warm-up
        SLEPT.clear()
        for rep in range(reps):
            for i, (client, (_, _, _, args)) in in_turn(list(enumerate(zip(clients, variants, strict=True))), rep):
                began = time.perf_counter()
                with meters[i]:
                    rates.setdefault(i, []).append(await _burst(client.call_tool, args, TARGET_CONCURRENCY, total))
                seconds[i] += time.perf_counter() - began
    calls = reps * total
    for i, (server, tool, _, _) in enumerate(variants):
        same_tool = 1 if tool == "waits" else 0
        collections = " / ".join(f"{n * 1000 / calls:.1f}" for n in meters[i].collections)
        table.add(
            server,
            tool,
            rate(median(rates[i])),
            ratio(median(rates[i]) / median(rates[same_tool])),
            f"{meters[i].seconds / seconds[i]:.0%}",
            collections,
        )
    slept, deciles = median(SLEPT), statistics.quantiles(SLEPT, n=10)
    SLEPT.clear()
    table.notes.append(
        f"{reps} interleaved repetitions of {total} calls each, the order reversed every other one (medians). "
        "The waiting tool awaits "
        f"`anyio.sleep({WAIT_S})`, which lasted {us(slept)} (median; 10th-90th percentile "
        f"{us(deciles[0])}-{us(deciles[-1])}): the event loop serves every "
        "ready task before it looks at its timers again. While it waits, its request's state stays alive "
        "as a durable call's does while its journal syncs, so young collections find survivors and promote "
        "them, and full collections (which walk every object of the process) follow. Read the plain rows "
        "against each other for what waiting costs any server, and the durable row against the plain one "
        "with the same tool for what the durable layer adds to a call that is not a pure no-op."
    )
    return table
