"""Case 1: sequential latency through the in-memory client, in both protocol eras.

Per journal: the plain no-op call, the durable first call (a miss: a new key every call, so the
claim and the result are made durable before the answer) and the durable repeat (a replay of
one key). Variants are measured in interleaved rounds, in a new (seeded) order each round, so that the
machine's load drifts over all of them alike; each cell is the median of every sample.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from typing import Any

from mcp import Client

from .common import (
    CaseResult,
    FsyncProbe,
    Settings,
    Table,
    Target,
    journal_urls,
    median,
    ratio,
    skipped_journals,
    us,
    verdict,
)
from .servers import TOOL, durable_server, plain_server, plain_server_with_meta
from .timing import check_result, fresh_arguments, timed_calls

ERAS = {"legacy": "2025-11-25 (legacy)", "auto": "2026-07-28"}
REPLAY_N = -1  # the argument of the one call every replay repeats


async def run(settings: Settings) -> CaseResult:
    result = CaseResult("latency")
    # Many short rounds: this machine's speed swings between states lasting tens of ms, longer
    # than a round of 100 calls, so a cell's median depended on which states its few rounds met.
    # Ten calls a round, 80 rounds, and every variant samples the same mix of states.
    rounds = settings.pick(4, 80)
    per_round = 10
    # Misses wait for two fsyncs each: half as many keep the case short on a loaded machine.
    per_round_miss = per_round // 2
    urls = journal_urls(settings)
    samples: dict[tuple[str, str, str], list[float]] = {}

    async with AsyncExitStack() as stack:
        plain = plain_server()
        plain_meta = plain_server_with_meta()
        durables = {name: durable_server(url) for name, url in urls.items()}
        fresh: dict[str, Iterator[int]] = {name: itertools.count(1) for name in urls}
        variants: list[tuple[tuple[str, str, str], Callable[..., Awaitable[Any]], Callable[[], dict[str, int]]]] = []
        for era in ERAS:
            client = await stack.enter_async_context(Client(plain, mode=era))
            variants.append(((era, "plain", ""), client.call_tool, lambda: {"n": 1}))
            client = await stack.enter_async_context(Client(plain_meta, mode=era))
            variants.append(((era, "plain+meta", ""), client.call_tool, lambda: {"n": 1}))
            for name, server in durables.items():
                client = await stack.enter_async_context(Client(server, mode=era))
                counter = fresh[name]
                variants.append(((era, "miss", name), client.call_tool, fresh_arguments(counter)))
                variants.append(((era, "replay", name), client.call_tool, lambda: {"n": REPLAY_N}))
        # Warm up every path (and complete the one call replays repeat); check each answers right.
        for (_, kind, _), call, args in variants:
            for i in range(20):
                expect = None if kind.startswith("plain") or (kind == "replay" and i == 0) else kind == "replay"
                check_result(await call(TOOL, args()), replayed=expect)
        # The disk's fsync is sampled in every round too: the miss bar is stated in fsyncs, and
        # a disk's latency drifts over minutes (the figure taken at start can be far off).
        probe = FsyncProbe(settings.workdir)
        try:
            for round_number in range(rounds):
                # A new order each round (seeded: the same every run): whatever follows a run of
                # misses (the disk's own work after their syncs) falls on every variant alike.
                order = list(variants)
                random.Random(round_number).shuffle(order)
                for key, call, args in order:
                    count = per_round_miss if key[1] == "miss" else per_round
                    samples.setdefault(key, []).extend(await timed_calls(call, args, count))
                samples.setdefault(("", "fsync", ""), []).extend(probe.sample(per_round_miss))
        finally:
            probe.close()

    fsync = median(samples[("", "fsync", "")])
    table = Table(
        "1. Sequential latency, in-memory client (median per call)",
        [
            "journal",
            "era",
            "plain",
            "miss",
            "miss − plain",
            "replay",
            "replay / plain",
            "replay ≤ 1.0x",
            "miss ≤ plain + 2·fsync",
        ],
    )
    table.notes.append(
        f"{rounds} interleaved rounds × {per_round} calls per cell ({per_round_miss} for misses); "
        "fsync (4 KiB append + fsync) "
        f"sampled in every round: {us(fsync)} (at start: {us(settings.fsync_s)}); "
        "miss = a new key per call (claim and result durable before the answer), replay = the same key again."
    )
    control = Table(
        "1b. Control: what the replay `_meta` alone costs (plain server, same result plus a replay's `_meta`)",
        ["era", "plain", "plain + replay _meta", "ratio"],
    )
    for era, era_label in ERAS.items():
        plain_s, meta_s = median(samples[(era, "plain", "")]), median(samples[(era, "plain+meta", "")])
        control.add(era_label, us(plain_s), us(meta_s), ratio(meta_s / plain_s))
    control.notes.append(
        "every durable result carries `_meta` (mcp-durable/key, and on a replay mcp-durable/replayed and "
        "first-completed-at: docs/guarantees.md); this row measures that cost through the SDK with no journal at all."
    )
    table.notes.extend(skipped_journals())
    verdicts: dict[str, list[tuple[str, float, bool, float, bool]]] = {}
    for name in urls:
        for era, era_label in ERAS.items():
            plain_s = median(samples[(era, "plain", "")])
            miss_s = median(samples[(era, "miss", name)])
            replay_s = median(samples[(era, "replay", name)])
            replay_ok = replay_s <= plain_s
            miss_ok = miss_s <= plain_s + 2 * fsync
            table.add(
                name,
                era_label,
                us(plain_s),
                us(miss_s),
                us(miss_s - plain_s),
                us(replay_s),
                ratio(replay_s / plain_s, 3),
                verdict(replay_ok),
                verdict(miss_ok),
            )
            verdicts.setdefault(name, []).append((era, replay_s / plain_s, replay_ok, miss_s - plain_s, miss_ok))
    result.tables.append(table)
    result.tables.append(control)
    for name, rows in verdicts.items():
        result.targets.append(
            Target(
                f"Replay latency ≤ 1.0× plain [{name}]",
                "≤ 1.000x in both eras",
                ", ".join(f"{ERAS[era].split(' ')[0]}: {ratio(r, 3)}" for era, r, _, _, _ in rows),
                all(ok for _, _, ok, _, _ in rows),
            )
        )
        if name != "file":
            # Nothing to fsync in memory; SQLite and Postgres show their extra in the table, but
            # the bar is the embedded default's (issue 15), as a database's commit is not one fsync.
            continue
        result.targets.append(
            Target(
                f"Sequential miss ≤ plain + 2 × fsync [{name}]",
                f"extra ≤ {us(2 * fsync)}",
                ", ".join(f"{ERAS[era].split(' ')[0]}: +{us(extra)}" for era, _, _, extra, _ in rows),
                all(ok for *_, ok in rows),
            )
        )
    return result
