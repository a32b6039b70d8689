"""One ready measurement of case 12 in a fresh process: `python -m benchmarks._scale_child URL P TOOL KEY`.

Prints one JSON object, like `_recovery_child`: `open_s` (the journal's `open()`), `ready_s`
(open plus the record `(P, TOOL, KEY)` fetched: the journal can serve), `baseline_rss` (peak RSS
after imports, before opening) and `peak_rss` (peak RSS at the end), in bytes.
"""

from __future__ import annotations

import sys
import time

import anyio
import orjson

from mcp_durable.journal import create_journal
from mcp_durable.journal.model import CallIdentity

from ._recovery_child import _rss


async def measure(url: str, identity: CallIdentity) -> dict[str, object]:
    journal = create_journal(url)
    baseline = _rss()
    began = time.perf_counter()
    await journal.open()
    opened = time.perf_counter()
    record = await journal.get(identity)
    if record is None or record.result is None:
        raise SystemExit(f"the journal at {url} lacks the record {identity}")
    ready = time.perf_counter()
    peak = _rss()
    await journal.aclose()
    return {"open_s": opened - began, "ready_s": ready - began, "baseline_rss": baseline, "peak_rss": peak}


def main() -> None:
    url, principal, tool, key = sys.argv[1:5]
    sys.stdout.write(orjson.dumps(anyio.run(measure, url, CallIdentity(principal, tool, key))).decode() + "\n")


if __name__ == "__main__":
    main()
