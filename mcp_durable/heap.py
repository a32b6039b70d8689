"""Keeping the cyclic garbage collector off the heap a server starts with: `gc.freeze()`, once.

Why: a durable miss waits for its journal (an fsync, a Postgres commit) with its request's
whole state alive, so at many concurrent callers CPython's young collections find survivors
and promote them; every tenth middle collection that has promoted enough then runs a *full*
collection, which walks every object of the process, including the ~120,000 the imports
(the SDK, pydantic, starlette, a database driver) left behind. Measured at 64 callers on the
Postgres journal (2026-12-02): four full collections per 3,000 calls, ~72 ms each, about a
fifth of the process's CPU; a plain server, whose no-op never waits, runs almost none.

What: once a server has started (its journal open), collect once and move every object then
alive to the collector's permanent generation (`gc.freeze()`, the technique CPython documents
for pre-fork servers). Frozen objects are still freed as usual when their last reference
goes; the collector simply no longer walks them, so a full collection costs what the objects
made since the start cost. Garbage cycles present at the freeze would never be collected,
hence the collection just before it. Done once per process: a second server started in the
same process (tests, several servers) finds it done.

Opt out with `DurableServer(freeze_heap=False)`, e.g. in a process that manages the collector
itself. Figures: docs/performance.md, "The collector and the startup heap".
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_frozen = False


def freeze_startup_heap() -> bool:
    """Collect, then freeze every object alive now; once per process. Returns whether this call did it."""
    global _frozen
    with _lock:
        if _frozen:
            return False
        _frozen = True
    gc.collect()
    gc.freeze()
    return True


def startup_heap_frozen() -> bool:
    """Whether `freeze_startup_heap` has run in this process."""
    return _frozen
