"""A process that appends entries of mixed sizes (up to 1 MiB) to a file journal until killed.

`python -m tests.crash.file_writer URL START WRITERS`: opens the journal, prints `ready`, then
WRITERS concurrent tasks append entries numbered from START; after each append *returned*, the
task prints `ack <seq> <n>` (flushed), so every acknowledged entry is on the parent's pipe.
The parent kills this process with SIGKILL at a random moment.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

import anyio

from mcp_durable.journal import create_journal

PROCESS = "crash/writer"
SIZES = (0, 100, 1_000, 4_096, 30_000, 200_000, 1_048_576)


def entry_data(n: int) -> dict[str, Any]:
    """The n-th entry, recomputable by the parent: a size from the mix and a blob derived from n."""
    digest = hashlib.sha256(b"%d" % n).hexdigest()
    size = SIZES[int(digest[:8], 16) % len(SIZES)]
    blob = (digest * (size // len(digest) + 1))[:size]
    return {"n": n, "size": size, "blob": blob}


async def main(url: str, start: int, writers: int) -> None:
    journal = create_journal(url)
    await journal.open()
    print("ready", flush=True)
    counter = start

    async def writer() -> None:
        nonlocal counter
        while True:
            n = counter
            counter += 1
            entry = await journal.append(PROCESS, "context_update", entry_data(n), float(n))
            sys.stdout.write(f"ack {entry.seq} {n}\n")
            sys.stdout.flush()

    async with anyio.create_task_group() as group:
        for _ in range(writers):
            group.start_soon(writer)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
