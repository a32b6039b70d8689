"""The recorded workload: durable calls through the real `Engine` on a file or SQLite journal.

`python -m tests.powerloss.workload KIND ROOT MARKERS [--calls N] [--seed S]` runs, on the
journal `ROOT/journal` (file) or `ROOT/journal/journal.db` (SQLite, as `sqlite:///` URLs
configure it):

- calls of four tools, several at a time (group commit batches): `pay` (three durable steps,
  results of 20 bytes to 3 KB), `decline` (a deliberate error result, FAILED), `boom` (raises:
  the claim is RELEASED), `temp` (5 s retention, expired and purged by the compactions);
- repeats of earlier keys (replayed from the journal);
- the file journal with 8 KiB segments (rotation every few calls), a snapshot every 60
  frames and on close (written by a forked child before the restart, from a copy after it:
  strace follows the child, which opens nothing but its temp file), `compact()` twice while
  calls go on; SQLite with its own checkpoints (at close and on its default autocheckpoint)
  and `purge_expired` where the file journal compacts;
- a restart in the middle (engine and journal closed and opened again: recovery, orphan
  cleanup, the snapshot written on close).

Markers, one JSON line per `write` to MARKERS, ordered against the journal's syscalls in the
same strace log: `claimed` (inside the tool: its claim returned, so it was durable), `step`
(a durable step returned), `ack` (the engine returned a result to the caller), `window`
(begin/end of a snapshot, compaction or restart).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
from pathlib import Path
from typing import Any

import anyio
import orjson

from mcp_durable import Engine, ToolOutcome, ToolPolicy
from mcp_durable.engine import Runner
from mcp_durable.journal import Journal
from mcp_durable.steps import DurableCall

KEY_META = "mcp-durable/idempotency-key"
PRINCIPALS = ("local", "alice")
SEGMENT_BYTES = 8 * 1024
SNAPSHOT_EVERY = 60


class Clock:
    """Wall time plus a shift the workload moves forward, so short retentions expire."""

    def __init__(self) -> None:
        self.shift = 0.0

    def __call__(self) -> float:
        import time

        return time.time() + self.shift


def journal_path(kind: str, root: Path) -> Path:
    return root / "journal" if kind == "file" else root / "journal" / "journal.db"


def make_journal(kind: str, root: Path, synchronous: str | None = None, *, snapshot_in_child: bool = False) -> Journal:
    """The journal under test. `snapshot_in_child`: the file journal's snapshots are written by a
    forked child (`snapshot_child`, traced too: strace follows it) rather than from a copy."""
    if kind == "file":
        from mcp_durable.journal.file import FileJournal
        from mcp_durable.journal.file import journal as file_journal

        file_journal.SNAPSHOT_EVERY = SNAPSHOT_EVERY  # small, so snapshots happen in the recording
        file_journal.SNAPSHOT_ON_CLOSE = SNAPSHOT_EVERY
        file_journal.SNAPSHOT_IN_CHILD_AT = 0 if snapshot_in_child else 10**12
        return FileJournal(journal_path(kind, root), segment_bytes=SEGMENT_BYTES)
    from mcp_durable.journal.sqlite import SQLiteJournal

    query = f"?synchronous={synchronous}" if synchronous else ""  # the default (FULL) unless told
    return SQLiteJournal.from_url(f"sqlite:///{journal_path(kind, root)}{query}")


def result_for(key: str, size: int) -> bytes:
    blob = (hashlib.sha256(key.encode()).hexdigest() * (size // 64 + 1))[:size]
    return orjson.dumps({"content": [{"type": "text", "text": f"paid {key}"}], "structuredContent": {"blob": blob}})


class Workload:
    def __init__(
        self,
        kind: str,
        root: Path,
        markers: Path,
        calls: int,
        seed: int,
        synchronous: str | None = None,
        first_key: int = 0,
    ) -> None:
        self.kind = kind
        self.first_key = first_key
        self.synchronous = synchronous
        self.root = root
        self.rng = random.Random(seed)
        self.calls = calls
        self.clock = Clock()
        self.marker_fd = os.open(markers, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.done: list[tuple[str, str, str]] = []  # (principal, tool, key) acknowledged, for repeats

    def mark(self, **fields: Any) -> None:
        os.write(self.marker_fd, orjson.dumps(fields) + b"\n")

    def tool(self, tool: str, key: str, principal: str, size: int) -> Runner:
        async def run(call: DurableCall | None) -> ToolOutcome:
            assert call is not None
            self.mark(m="claimed", principal=principal, tool=tool, key=key)
            if tool == "pay":
                for index, name in enumerate(("reserve", "charge", "receipt")):
                    value = {"step": name, "key": key, "n": self.rng.randrange(1000)}
                    result = await call.step(name, lambda v=value: v)
                    self.mark(m="step", process_id=call.process_id, index=index, name=name, result=result)
            if tool == "boom":
                raise RuntimeError("the tool failed unexpectedly: released")
            payload = result_for(key, size)
            return ToolOutcome(None, payload, is_error=tool == "decline")

        return run

    async def one(self, engine: Engine, n: int) -> None:
        rng = self.rng
        if self.done and rng.random() < 0.15:
            principal, tool, key = rng.choice(self.done)  # a repeat: replayed
        else:
            tool = rng.choices(("pay", "decline", "boom", "temp"), weights=(6, 1, 1, 2))[0]
            principal, key = rng.choice(PRINCIPALS), f"k{n:06d}"
        retention = 5.0 if tool == "temp" else 24 * 3600.0
        policy = ToolPolicy(retention=retention)
        size = rng.choice((20, 200, 900, 3000))
        try:
            outcome = await engine.execute(
                tool=tool,
                policy=policy,
                arguments={"n": key},
                meta={KEY_META: key},
                run=self.tool(tool, key, principal, size),
                principal=principal,
            )
        except RuntimeError:
            return
        assert outcome.payload is not None
        self.mark(
            m="ack",
            principal=principal,
            tool=tool,
            key=key,
            payload=outcome.payload.decode(),
            failed=tool == "decline",
            expires=tool == "temp",
            at=self.clock(),
        )
        self.done.append((principal, tool, key))

    async def batch(self, engine: Engine, first: int, count: int) -> None:
        async with anyio.create_task_group() as tg:
            for n in range(first, first + count):
                tg.start_soon(self.one, engine, n)

    async def maintain(self, engine: Engine, journal: Journal) -> None:
        self.clock.shift += 10.0  # the `temp` records acknowledged so far expire
        self.mark(m="window", name="compaction", phase="begin")
        compact = getattr(journal, "compact", None)
        if compact is not None:
            await compact(self.clock())
        else:
            await engine.purge_expired()
        self.mark(m="window", name="compaction", phase="end")

    async def snapshot(self, journal: Journal) -> None:
        take = getattr(journal, "snapshot", None)
        if take is not None:
            self.mark(m="window", name="snapshot", phase="begin")
            await take()
            self.mark(m="window", name="snapshot", phase="end")

    async def run(self) -> None:
        half = self.first_key + self.calls // 2
        n = self.first_key
        for boot in range(2):
            # Before the restart a forked child writes each snapshot, after it a copy does.
            journal = make_journal(self.kind, self.root, self.synchronous, snapshot_in_child=boot == 0)
            engine = Engine(journal, clock=self.clock)
            self.mark(m="window", name="restart", phase="end" if boot else "open")
            await engine.start()
            stop = half if boot == 0 else self.first_key + self.calls
            while n < stop:
                count = min(self.rng.randint(1, 6), stop - n)
                await self.batch(engine, n, count)
                n += count
                if n % 50 < count:
                    await self.snapshot(journal)
                if n % (self.calls // 3 or 1) < count:
                    # Calls keep coming while the journal compacts (records change during the copy).
                    more = min(4, stop - n)
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self.maintain, engine, journal)
                        tg.start_soon(self.batch, engine, n, more)
                    n += more
            if boot == 0:
                self.mark(m="window", name="restart", phase="begin")
            await engine.aclose()
        self.mark(m="done")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("file", "sqlite"))
    parser.add_argument("root", type=Path)
    parser.add_argument("markers", type=Path)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--synchronous", help="SQLite: the URL's synchronous= (default: the journal's FULL)")
    parser.add_argument("--first-key", type=int, default=0, help="number the keys from here (a second run)")
    args = parser.parse_args()
    anyio.run(Workload(args.kind, args.root, args.markers, args.calls, args.seed, args.synchronous, args.first_key).run)


if __name__ == "__main__":
    main()
