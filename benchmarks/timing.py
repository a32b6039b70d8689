"""Timing loops and the sanity check every measured answer passes (a benchmark fails on errors only)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from .servers import TOOL

REPLAYED = "mcp-durable/replayed"


class BenchmarkError(RuntimeError):
    """A measured call did not answer as it must: the figures would be meaningless."""


def fresh_arguments(counter: Iterator[int]) -> Callable[[], dict[str, int]]:
    """Arguments with a new `n` on every call: a new derived key, so every durable call is a miss."""
    return lambda: {"n": next(counter)}


def check_result(result: Any, *, replayed: bool | None = None) -> None:
    """Raise `BenchmarkError` unless `result` is the no-op's answer (and replayed, when asked)."""
    if getattr(result, "is_error", False):
        raise BenchmarkError(f"the call failed: {result}")
    if replayed is not None:
        meta = getattr(result, "meta", None) or {}
        if bool(meta.get(REPLAYED)) != replayed:
            raise BenchmarkError(f"expected replayed={replayed}, got meta {meta}")


async def timed_calls(
    call: Callable[..., Awaitable[Any]], args: Callable[[], dict[str, int]], count: int
) -> list[float]:
    """Seconds of each of `count` sequential calls of the no-op tool."""
    times: list[float] = []
    clock = time.perf_counter
    for _ in range(count):
        arguments = args()
        began = clock()
        await call(TOOL, arguments)
        times.append(clock() - began)
    return times
