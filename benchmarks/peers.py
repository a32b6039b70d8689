"""Case 9: the peers side by side — what a user would pick instead of mcp-durable, same run.

The same no-op tool made idempotent inside a plain `MCPServer` by DBOS Transact (workflow id =
the key; SQLite and Postgres system databases) and by Powertools' idempotency utility on Redis
(the Redis on this machine as it is configured, and a Redis of our own with AOF `appendfsync
always`, i.e. every write fsynced like our journals), beside mcp-durable on SQLite and Postgres
and the plain server. Per system: sequential miss and replay latency (interleaved rounds,
medians) and misses per second at 64 callers (interleaved repetitions, medians), all through the
in-memory client (2026-07-28).

DBOS is one instance per process, so the run has two phases, each measured side by side with
the plain server: SQLite (mcp-durable on SQLite, DBOS on SQLite, Powertools on both Redis) and
Postgres (mcp-durable on Postgres, DBOS on Postgres, Powertools on both Redis again).

The SIGKILL harness: for each system, a process calls the refund tool (whose downstream, the demo
payment ledger, does not honour keys) and kills itself right after the money moved, before the
idempotency layer recorded the result — inside the danger window; a new process then retries
the same call. Counted: the duplicate refunds left in the ledger, and what the retry answered.

Targets: mcp-durable ahead of each peer at comparable durability (DBOS on SQLite / Postgres
against ours on the same; Powertools on Redis with `appendfsync always` against ours on SQLite
and on Postgres) on miss latency, replay latency and miss throughput. The Redis as configured
here is shown, not judged. Needs the `peers` extra; without it the case reports what is missing.
"""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.server.mcpserver import MCPServer

from .common import (
    CaseResult,
    Settings,
    Table,
    Target,
    file_journal_available,
    median,
    postgres_available,
    postgres_url,
    rate,
    ratio,
    us,
)
from .servers import TOOL, plain_server
from .throughput import _burst
from .timing import check_result, timed_calls

CALLERS = 64
SHARED_REDIS_PORT = int(os.environ.get("MCP_DURABLE_BENCH_REDIS_PORT", "6379"))
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Variant:
    """One system measured in a phase: its server, and what it gave."""

    name: str
    server: MCPServer
    miss: list[float] = field(default_factory=list)
    replay: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    failure: str | None = None


def _missing() -> str | None:
    try:
        import aws_lambda_powertools  # noqa: F401
        import dbos  # noqa: F401
        import redis  # noqa: F401
    except ImportError as exc:
        return f"the peers are not installed ({exc.name}): pip install -e '.[peers]'"
    return None


def _shared_redis_up() -> bool:
    import redis

    try:
        client = redis.Redis(host="127.0.0.1", port=SHARED_REDIS_PORT, socket_connect_timeout=2)
        client.ping()
        client.close()
        return True
    except redis.RedisError:
        return False


async def _measure_phase(settings: Settings, variants: list[Variant]) -> None:
    """Latency rounds, then throughput repetitions, every variant interleaved with the others."""
    # As many short rounds as case 1 (80, 400 misses per system, was 20): the machine's speed
    # swings in states lasting tens of ms, and each system should meet the same mix of them.
    rounds = settings.pick(2, 80)
    per_round = 5
    total = settings.pick(64, 1000)
    reps = settings.pick(1, 3)
    async with AsyncExitStack() as stack:
        clients: dict[str, tuple[Callable[..., Awaitable[Any]], Iterator[int]]] = {}
        for variant in variants:
            client = await stack.enter_async_context(Client(variant.server))
            counter = itertools.count(1 + random.randrange(10**9) * 1000)
            try:
                for _ in range(3):  # warm-up, and the call every replay repeats
                    check_result(await client.call_tool(TOOL, {"n": next(counter)}))
                check_result(await client.call_tool(TOOL, {"n": 0}))
            except Exception as exc:  # noqa: BLE001 - a peer that fails is reported, not fatal
                variant.failure = f"{type(exc).__name__}: {exc}"[:200]
                continue
            clients[variant.name] = (client.call_tool, counter)
        live = [v for v in variants if v.failure is None]
        for round_number in range(rounds):
            # Misses and replays are separate cells in a new (seeded) order each round, as in
            # case 1: a replay right after a run of misses would pay their idle-CPU penalty
            # (docs/dev/performance-notebook.md, "Sequential miss ≤ plain + 2 × fsync") every time.
            order = [(variant, kind) for variant in live for kind in ("miss", "replay")]
            random.Random(round_number).shuffle(order)
            for variant, kind in order:
                call, counter = clients[variant.name]
                if kind == "miss":
                    variant.miss.extend(await timed_calls(call, lambda c=counter: {"n": next(c)}, per_round))
                else:
                    variant.replay.extend(await timed_calls(call, lambda: {"n": 0}, per_round))
        for _ in range(reps):
            for variant in live:
                if variant.failure is not None:
                    continue
                call, counter = clients[variant.name]
                try:
                    variant.rates.append(await _burst(call, lambda c=counter: {"n": next(c)}, CALLERS, total))
                except Exception as exc:  # noqa: BLE001 - e.g. DBOS on SQLite: "database is locked"
                    variant.failure = f"at {CALLERS} callers: {type(exc).__name__}: {exc}"[:200]


def _crash_trial(peer: str, store: str, ledger: Path) -> tuple[int, str]:
    """One refund killed inside the danger window, then retried: (duplicates, what the retry said)."""
    from mcp_durable.demo.ledger import PaymentProvider

    from .peer_servers import CRASH_ENV, LEDGER_ENV

    order = f"order-{uuid.uuid4().hex[:8]}"
    command = [sys.executable, "-m", "benchmarks._peer_child", peer, store, order]
    env = {**os.environ, LEDGER_ENV: str(ledger), CRASH_ENV: "1"}
    crashed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=120)
    if crashed.returncode != -9:
        return 0, f"did not crash ({crashed.returncode}): {crashed.stderr.decode()[-200:]}"
    env[CRASH_ENV] = "0"
    retry = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=180)
    said = retry.stdout.decode().strip().splitlines()[-1:] or [f"no answer ({retry.returncode})"]
    effects = len(PaymentProvider(ledger).effects(op="refund", subject=order))
    return max(0, effects - 1), said[0].split(" ", 1)[0]


async def _crash_harness(settings: Settings, systems: dict[str, tuple[str, str]]) -> Table:
    trials = settings.pick(1, 5)
    table = Table(
        "9b. The danger window: a refund killed (SIGKILL) after its money moved, then retried",
        ["system", "trials", "duplicate refunds", "the retry answered"],
    )
    for name, (peer, store) in systems.items():
        ledger = settings.workdir / f"ledger-{uuid.uuid4().hex[:8]}.db"
        duplicates = 0
        answers: Counter[str] = Counter()
        for _ in range(trials):
            dup, said = await anyio.to_thread.run_sync(_crash_trial, peer, store, ledger)
            duplicates += dup
            answers[said] += 1
        table.add(name, trials, duplicates, ", ".join(f"{k} ×{v}" for k, v in answers.most_common()))
    table.notes.append(
        "the refund's downstream (the demo payment ledger) does not honour keys, so a second run is a second "
        "refund. mcp-durable's refund is declared in_doubt='refuse' (what the docs prescribe for such a tool): "
        "the retry is refused as in doubt for an operator to resolve. DBOS recovers the workflow at launch and "
        "re-runs the step whose output it had not checkpointed. Powertools leaves the key INPROGRESS until it "
        "expires (expires_after_seconds, 1 h here): the retry is refused meanwhile, then runs again."
    )
    return table


async def run(settings: Settings) -> CaseResult:
    result = CaseResult("peers")
    missing = _missing()
    if missing is not None:
        table = Table("9. Peers side by side", ["note"])
        table.add(missing)
        result.tables.append(table)
        return result
    from .peer_servers import dbos_peer, dbos_session, durable_peer, powertools_peer, redis_config, redis_fsync_always

    shared = _shared_redis_up()
    pg = postgres_available()
    phases: dict[str, list[Variant]] = {}
    stores: dict[str, tuple[str, str]] = {}
    with ExitStack() as stack:
        aof_port = stack.enter_context(redis_fsync_always())
        redis_variants = [(f"Powertools + Redis ({redis_config(aof_port)})", aof_port)]
        if shared:
            redis_variants.append(
                (f"Powertools + Redis as configured here ({redis_config(SHARED_REDIS_PORT)})", SHARED_REDIS_PORT)
            )
        backends = [
            (
                "sqlite",
                f"sqlite:///{settings.workdir}/peers-{uuid.uuid4().hex[:8]}.db",
                f"sqlite:///{settings.workdir}/dbos-{uuid.uuid4().hex[:8]}.db",
                None,
            )
        ]
        if pg:
            schema = f"bench_dbos_{uuid.uuid4().hex[:8]}"
            backends.append(("postgres", postgres_url(), _pg_base(), schema))
        for backend, journal, dbos_url, dbos_schema in backends:
            with dbos_session(dbos_url, dbos_schema):
                variants = [
                    Variant("plain MCPServer", plain_server()),
                    Variant(f"mcp-durable, {backend}", durable_peer(journal)),
                    Variant(f"DBOS, {backend}", dbos_peer()),
                ]
                variants += [Variant(name, powertools_peer(port)) for name, port in redis_variants]
                if backend == "sqlite" and file_journal_available():  # the embedded default, for reference
                    variants.append(
                        Variant(
                            "mcp-durable, file (the default)",
                            durable_peer(f"file://{settings.workdir}/peers-{uuid.uuid4().hex[:8]}"),
                        )
                    )
                await _measure_phase(settings, variants)
                for variant in variants:
                    closer = getattr(variant.server, "aclose", None)
                    if closer is not None:
                        await closer()
            phases[backend] = variants
            crash_journal = journal if backend == "postgres" else journal + "?single_writer=1"
            stores[f"mcp-durable, {backend}"] = ("durable", crash_journal)
            stores[f"DBOS, {backend}"] = ("dbos", dbos_url + (f"#{dbos_schema}" if dbos_schema else ""))
        for name, port in redis_variants:
            stores[name] = ("powertools", str(port))
        crash_table = await _crash_harness(settings, stores)
        if pg:
            _drop_schema(backends[1][3])

    result.tables.append(_figures_table(phases))
    result.tables.append(crash_table)
    result.targets.extend(_targets(phases))
    return result


def _pg_base() -> str:
    from .common import PG_BASE

    return PG_BASE


def _drop_schema(schema: str | None) -> None:
    if schema is None:
        return
    try:
        import psycopg

        with psycopg.connect(_pg_base(), connect_timeout=2, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    except Exception:  # noqa: BLE001 - best effort
        pass


def _figures_table(phases: dict[str, list[Variant]]) -> Table:
    table = Table(
        "9. Peers side by side: the same no-op tool, idempotent by key, in-memory client (2026-07-28)",
        [
            "phase",
            "system",
            "miss",
            "replay",
            f"misses/s at {CALLERS}",
            "miss / plain",
            "replay / plain",
            "misses/s / plain",
        ],
    )
    for phase, variants in phases.items():
        plain = variants[0]
        p_miss, p_replay, p_rate = median(plain.miss), median(plain.replay), median(plain.rates)
        for variant in variants:
            if variant.failure is not None and not variant.miss:
                table.add(phase, variant.name, "failed", "", "", "", "", variant.failure)
                continue
            miss, replay = median(variant.miss), median(variant.replay)
            throughput = median(variant.rates) if variant.rates else float("nan")
            table.add(
                phase,
                variant.name,
                us(miss),
                us(replay),
                rate(throughput) if variant.rates else f"failed: {variant.failure}",
                ratio(miss / p_miss),
                ratio(replay / p_replay, 3),
                ratio(throughput / p_rate) if variant.rates else "–",
            )
    table.notes.append(
        "per phase, every system measured side by side: latency in interleaved rounds (5 misses and 5 replays per "
        "system per round, each a cell of its own in a new order every round; medians), then misses per second "
        "with 64 concurrent callers (medians of the repetitions). A miss is a new key; a replay repeats one key. "
        "Every store syncs each write except the "
        "Redis 'as configured here' (the machine's shared Redis, shown as Powertools is usually deployed)."
    )
    return table


def _targets(phases: dict[str, list[Variant]]) -> list[Target]:
    """mcp-durable against each peer at comparable durability, in the same phase."""
    targets: list[Target] = []
    for phase, variants in phases.items():
        by_name = {v.name: v for v in variants}
        ours = by_name.get(f"mcp-durable, {phase}")
        if ours is None or ours.failure is not None:
            continue
        rivals = [v for v in variants if v.name == f"DBOS, {phase}" or "appendfsync always" in v.name]
        for rival in rivals:
            name = f"mcp-durable ahead of {rival.name} [{phase}]"
            if rival.failure is not None and not rival.rates:
                targets.append(Target(name, "ahead on miss, replay, misses/s", f"peer failed: {rival.failure}", True))
                continue
            miss = median(rival.miss) / median(ours.miss)
            replay = median(rival.replay) / median(ours.replay)
            speed = median(ours.rates) / median(rival.rates) if rival.rates and ours.rates else float("inf")
            ahead = miss > 1 and replay > 1 and speed > 1
            measured = f"peer/ours: miss {ratio(miss)}, replay {ratio(replay)}; ours/peer misses/s {ratio(speed)}" + (
                ""
                if ahead
                else " — PEER AHEAD on "
                + ", ".join(
                    what for what, value in (("miss", miss), ("replay", replay), ("misses/s", speed)) if value <= 1
                )
            )
            targets.append(Target(name, "> 1.00x on each", measured, ahead))
    return targets
