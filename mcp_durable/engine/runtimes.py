"""How long each tool's calls take, for the `retry_after` of an `in_progress` refusal. Pure.

A duplicate that gives up waiting for a running call is told when to retry. The lease's
remaining time (what this used to be) says nothing about the call: 29.7 s for a job of one
second. Instead each engine keeps the durations of the last `KEPT` completed runs of every tool
(on this instance, in the engine's clock) and estimates:

    retry_after = median(durations) - elapsed      (elapsed: since the running call was claimed)

- a call already running longer than the median is expected soon: half the median;
- with no run of the tool seen yet, the time the call has run so far (it is at least halfway,
  on average, for a call observed at a random moment);
- always at least `FLOOR` seconds, and at most the lease's remaining time (after which the
  call is in doubt and the retry decides by policy anyway).

A median, not a mean: one call stuck on a slow downstream must not skew the advice for all.
"""

from __future__ import annotations

import statistics
from collections import deque

KEPT = 32  # durations kept per tool
FLOOR = 0.1  # seconds: the least retry_after ever advised


class RunTimes:
    """Recent run durations per tool, and the `retry_after` they suggest."""

    def __init__(self) -> None:
        self._durations: dict[str, deque[float]] = {}

    def record(self, tool: str, seconds: float) -> None:
        """Note that a run of `tool` took `seconds` (negative values, from a clock set back, are dropped)."""
        if seconds >= 0:
            durations = self._durations.get(tool)
            if durations is None:  # not `setdefault`: it would build a deque on every call
                durations = self._durations[tool] = deque(maxlen=KEPT)
            durations.append(seconds)

    def median(self, tool: str) -> float | None:
        """The median of the kept durations of `tool`, or None if none was recorded."""
        durations = self._durations.get(tool)
        return statistics.median(durations) if durations else None

    def retry_after(self, tool: str, elapsed: float, lease_left: float) -> float:
        """Seconds a duplicate should wait before retrying a call of `tool` running for `elapsed` s."""
        typical = self.median(tool)
        if typical is None:
            estimate = elapsed
        elif typical > elapsed:
            estimate = typical - elapsed
        else:
            estimate = typical / 2
        return max(FLOOR, min(estimate, lease_left))
