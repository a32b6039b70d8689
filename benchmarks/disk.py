"""Case 6: bytes on disk per call record, per journal.

Calls of the durable no-op tool through the in-memory client, each a miss (a new key), so every
call leaves one COMPLETED record (its key, fingerprint, arguments and result). The size is
measured after the journal is closed (SQLite has then folded its WAL into the database), minus
the size of the same journal holding nothing but the server's own lifecycle entries.
"""

from __future__ import annotations

from pathlib import Path

from mcp import Client

from mcp_durable.journal import create_journal

from .common import CaseResult, Settings, Table, dir_size, journal_urls, skipped_journals
from .servers import TOOL, durable_server
from .timing import check_result


async def _size(name: str, url: str) -> int:
    if name == "postgres":
        journal = create_journal(url)
        await journal.open()
        try:
            stats = await journal.stats()
        finally:
            await journal.aclose()
        return int(stats.size_bytes or 0)
    path = url.split("://", 1)[1]
    if name == "sqlite":
        path = path[1:] if path.startswith("/") else path
        db = Path(path)
        return sum(dir_size(p) for p in db.parent.glob(db.name + "*"))
    return dir_size(Path(path))


async def run(settings: Settings) -> CaseResult:
    result = CaseResult("disk")
    calls = settings.pick(100, 1000)
    urls = journal_urls(settings, memory=False)
    table = Table("6. Bytes on disk per call record", ["journal", "records", "journal size", "bytes per record"])
    for name, url in urls.items():
        server = durable_server(url)
        async with Client(server) as client:  # an empty journal: only the lifecycle entries
            check_result(await client.call_tool(TOOL, {"n": 0}))
        empty = await _size(name, url)
        server = durable_server(url)
        async with Client(server) as client:
            for i in range(1, calls + 1):
                check_result(await client.call_tool(TOOL, {"n": i}))
        full = await _size(name, url)
        table.add(name, f"{calls:,}", f"{full:,} B", f"{(full - empty) / calls:,.0f}")
    table.notes.append(
        "each record: principal, tool, a derived key (sha256:… 71 characters), fingerprint, state, times, "
        'the arguments ({"n": i}) and the stored result (the no-op\'s "ok" as a CallToolResult); '
        "size after close, minus the same journal with one record."
    )
    table.notes.extend(skipped_journals())
    result.tables.append(table)
    return result
