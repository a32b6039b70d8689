"""Case 7: what `mcp-durable proxy` adds per call, against calling the upstream directly.

The upstream is a plain `MCPServer` subprocess over stdio (`_proxy_upstream.py`). Directly: the
SDK client talks to it over stdio. Through the proxy: the client talks in process to a
`ProxyServer` (both eras), which holds its own stdio session with the upstream. Per journal:
a pass-through call, a durable miss (a new derived key per call: claim and result made durable,
the call forwarded with the key) and a durable replay (answered from the journal without
reaching the upstream). Variants run in interleaved, shuffled rounds, like case 1; each cell is
the median of every sample.
"""

from __future__ import annotations

import itertools
import random
import sys
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

from mcp import Client, StdioServerParameters

from mcp_durable.policy_file import parse_policies
from mcp_durable.proxy import ProxyServer, UpstreamSpec

from ._proxy_upstream import PASS_TOOL
from .common import CaseResult, Settings, Table, journal_urls, median, us
from .timing import check_result, fresh_arguments, timed_calls

ERAS = {"legacy": "2025-11-25 (legacy)", "auto": "2026-07-28"}
REPLAY_N = -1


def _upstream() -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "benchmarks._proxy_upstream"])


async def run(settings: Settings) -> CaseResult:
    result = CaseResult("proxy")
    rounds = settings.pick(3, 60)
    per_round = 10
    urls = {name: url for name, url in journal_urls(settings).items() if name in ("memory", "file", "sqlite")}
    samples: dict[tuple[str, str, str], list[float]] = {}
    Call = Callable[..., Awaitable[Any]]
    variants: list[tuple[tuple[str, str, str], Call, Callable[[], dict[str, int]]]] = []

    def renamed(call: Call, tool: str) -> Call:
        return lambda _name, arguments: call(tool, arguments)

    async with AsyncExitStack() as stack:
        direct = await stack.enter_async_context(Client(_upstream(), mode="legacy"))
        variants.append((("direct", "upstream", ""), direct.call_tool, lambda: {"n": 1}))
        for name, url in urls.items():
            counter = itertools.count(1)
            proxy = ProxyServer(
                UpstreamSpec(command=[sys.executable, "-m", "benchmarks._proxy_upstream"]),
                # Keyed by its arguments, as before keys derived from all arguments became opt-in.
                parse_policies('[tools.noop]\nkey = "derived"\n'),
                journal=url,
                log_level="WARNING",
            )
            for era in ERAS:
                client = await stack.enter_async_context(Client(proxy, mode=era))
                variants.append(((era, "pass", name), renamed(client.call_tool, PASS_TOOL), lambda: {"n": 1}))
                variants.append(((era, "miss", name), client.call_tool, fresh_arguments(counter)))
                variants.append(((era, "replay", name), client.call_tool, lambda: {"n": REPLAY_N}))
        for (_, kind, _), call, args in variants:
            for i in range(10):
                expect = None if kind in ("upstream", "pass") or (kind == "replay" and i == 0) else kind == "replay"
                check_result(await call("noop", args()), replayed=expect)
        for round_number in range(rounds):
            order = list(variants)
            random.Random(round_number).shuffle(order)
            for key, call, args in order:
                count = per_round // 2 if key[1] == "miss" else per_round
                samples.setdefault(key, []).extend(await timed_calls(call, args, count))

    direct_s = median(samples[("direct", "upstream", "")])
    table = Table(
        "7. Proxy: added latency per call vs calling the upstream directly (stdio upstream, median per call)",
        ["journal", "client era", "direct", "pass-through", "+ pass", "miss", "+ miss", "replay", "+ replay"],
    )
    for name in urls:
        for era, era_label in ERAS.items():
            pass_s = median(samples[(era, "pass", name)])
            miss_s = median(samples[(era, "miss", name)])
            replay_s = median(samples[(era, "replay", name)])
            table.add(
                name,
                era_label,
                us(direct_s),
                us(pass_s),
                us(pass_s - direct_s),
                us(miss_s),
                us(miss_s - direct_s),
                us(replay_s),
                us(replay_s - direct_s),
            )
    table.notes.append(
        f"{rounds} interleaved rounds × {per_round} calls per cell ({per_round // 2} for misses). direct = the SDK "
        "client over stdio to the upstream (2025-11-25); through the proxy = an in-process client of a ProxyServer "
        "holding a stdio session with the same upstream. miss = a new derived key per call (claim and result "
        "durable, forwarded with the key); replay = the same key again (answered from the journal, the upstream "
        "not called: it can be faster than direct). + x = x − direct."
    )
    result.tables.append(table)
    return result
