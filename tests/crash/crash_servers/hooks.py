"""Crash hooks for crash tests: a server process SIGKILLs itself at a chosen point of a chosen call.

A test arms a `CrashPlan` (a small JSON file: the key to crash on and the point) before calling;
the server-side code calls `fire(key, point)` at each point it passes. When the armed key and
point match, the plan file is removed (so the retry does not crash again) and the process
SIGKILLs itself: no cleanup, no flush, no atexit — exactly what `kill -9` does to a server.

Points, in the order a call passes them:
- `before_effect`: the claim is journaled, the downstream effect not yet made;
- `danger_window`: the effect is made downstream, its result not yet journaled;
- `after_journal`: the result is journaled, not yet sent to the client.
Servers may define their own points too (e.g. `step 6` inside a durable step).

`Counter` appends one line per event to a file, so the test process counts what really ran.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import orjson

POINTS = ("before_effect", "danger_window", "after_journal")
ENV_PLAN = "CRASH_PLAN"
ENV_COUNTER = "CRASH_COUNTER"


class CrashPlan:
    """Where the next crash happens: at most one armed `(key, point)` at a time."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path else None

    def arm(self, key: str, point: str) -> None:
        assert self.path is not None, "no plan file"
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps({"key": key, "point": point}))
        os.replace(tmp, self.path)  # atomic: the server never reads half a plan

    def disarm(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)

    def armed(self) -> dict[str, str] | None:
        if self.path is None:
            return None
        try:
            return dict(orjson.loads(self.path.read_bytes()))
        except FileNotFoundError:
            return None

    def fire(self, key: str, point: str) -> None:
        """SIGKILL this process if the plan says to crash `key` at `point`."""
        plan = self.armed()
        if plan is None or plan.get("key") != key or plan.get("point") != point:
            return
        self.disarm()
        os.kill(os.getpid(), signal.SIGKILL)


class Counter:
    """Events in an append-only file, one line each (safe across processes, survives SIGKILL)."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path else None

    def hit(self, event: str) -> None:
        if self.path is None:
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{event}\n".encode())
        finally:
            os.close(fd)

    def lines(self) -> list[str]:
        if self.path is None or not self.path.exists():
            return []
        return self.path.read_text().splitlines()

    def count(self, event: str) -> int:
        return sum(1 for line in self.lines() if line == event)
