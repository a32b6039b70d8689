"""`verify_url(url)`: read every record of a journal and report what is corrupt, and where.

- `file://DIR`: the file journal's own `verify(directory, progress)` (every record's length,
  checksum and sequence number, and its payload decoded as the journal reads it).
- `sqlite:///PATH`: `PRAGMA integrity_check` (every b-tree page; a page number becomes a byte
  offset in the file), then every row decoded as the journal would: state, reason, numbers,
  and the JSON of arguments, results and entry data.
- anything else (Postgres, memory): every record and entry read through the `Journal` API.

Read-only: safe while a server holds the journal.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import orjson

from ..errors import ConfigError, DurableError
from .base import Problem, VerifyReport
from .masked_urls import display_url
from .model import CallState, Reason

Progress = Callable[[int, int | None], None]  # (done, total or None when unknown)
_STATES = frozenset(state.value for state in CallState)
_REASONS = frozenset(reason.value for reason in Reason)
_PAGE_MESSAGE = re.compile(r"\bpage (\d+)", re.IGNORECASE)


async def verify_url(url: str, progress: Progress | None = None) -> VerifyReport:
    """Verify the journal at `url`: every record (and, for files, every frame and checksum)."""
    scheme = url.split(":", 1)[0].lower()
    if scheme == "file":
        from .file import verify

        directory = url[len("file://") :].partition("?")[0]
        return await anyio.to_thread.run_sync(verify, Path(directory), progress)
    if scheme == "sqlite":
        from .sqlite import SQLiteJournal

        path = SQLiteJournal.from_url(url).path
        return await anyio.to_thread.run_sync(verify_sqlite, path, progress)
    return await _verify_through_api(url, progress)


def verify_sqlite(path: Path, progress: Progress | None = None) -> VerifyReport:
    """Check a SQLite journal file page by page, then row by row.

    Raises `ConfigError` when there is no file at `path`; every other fault is a `Problem` in the
    report. The problems found before the file turned unreadable are kept, followed by the one
    saying so; when none of them has a byte offset, a walk of the b-trees looks for the damaged
    page. `progress` is called every 100 records, then once with the total."""
    if not path.is_file():
        raise ConfigError(f"no SQLite journal at {path}")
    problems: list[Problem] = []
    records = 0
    where = str(path)
    try:
        conn = sqlite3.connect(path, timeout=5.0)
    except sqlite3.Error as exc:
        return VerifyReport(0, [Problem(where, -1, f"cannot open: {exc}")])
    try:
        for problem in _integrity_check(conn, where):
            problems.append(problem)
        for row_problem in _row_problems(conn, where):
            records += 1
            if row_problem is not None:
                problems.append(row_problem)
            if progress is not None and records % 100 == 0:
                progress(records, None)
    except sqlite3.DatabaseError as exc:
        problems.append(Problem(where, -1, f"unreadable: {exc}"))
    finally:
        conn.close()
    if problems and not any(p.offset >= 0 for p in problems):
        # SQLite said "malformed" without a place: find the damaged b-tree page ourselves.
        problems.extend(_walk_btrees(path))
    if progress is not None:
        progress(records, records)
    return VerifyReport(records, problems)


def _integrity_check(conn: sqlite3.Connection, where: str) -> Iterator[Problem]:
    """`PRAGMA integrity_check`'s findings, each at the byte offset of the page it names (-1 when
    it names none). A generator: what it found before an error is already yielded."""
    page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    for (message,) in conn.execute("PRAGMA integrity_check(1000)"):
        if message == "ok":
            continue
        page = _PAGE_MESSAGE.search(message)
        offset = (int(page.group(1)) - 1) * page_size if page else -1
        yield Problem(where, offset, f"integrity_check: {message}")


def _row_problems(conn: sqlite3.Connection, where: str) -> Iterator[Problem | None]:
    """One item per record, every row of `calls` then every row of `entries`: the problem with
    it, or None when it decodes as the journal would read it."""
    # `reason` came with schema 3: a file not migrated yet has none (the journal reads those
    # rows with `legacy_reason`), so it is read only where it exists.
    has_reason = "reason" in {column[1] for column in conn.execute("PRAGMA table_info(calls)")}
    rows = conn.execute(
        "SELECT rowid, principal, tool, key, fingerprint, state, version, attempts, created_at, updated_at, "
        f"result, arguments, {'reason' if has_reason else 'NULL'} FROM calls"
    )
    for row in rows:
        reason = _bad_call_row(row)
        yield Problem(f"{where} (table calls, rowid {row[0]}: {row[2]}/{row[3]})", -1, reason) if reason else None
    for seq, data, ts in conn.execute("SELECT seq, data, ts FROM entries"):
        reason = _bad_json(data, "data", want_object=True) or (None if isinstance(ts, float | int) else "ts")
        yield Problem(f"{where} (table entries, seq {seq})", -1, reason) if reason else None


def _bad_json(value: Any, name: str, *, want_object: bool = False) -> str | None:
    if value is None:
        return None
    try:
        parsed = orjson.loads(value)
    except (orjson.JSONDecodeError, TypeError) as exc:
        return f"{name} is not JSON: {exc}"
    if want_object and not isinstance(parsed, dict):
        return f"{name} is not a JSON object"
    return None


def _bad_call_row(row: tuple[Any, ...]) -> str | None:
    (
        _,
        principal,
        tool,
        key,
        fingerprint,
        state,
        version,
        attempts,
        created_at,
        updated_at,
        result,
        arguments,
        reason,
    ) = row
    if not all(isinstance(v, str) and v for v in (principal, tool, key)):
        return "identity is not three non-empty strings"
    if state not in _STATES:
        return f"unknown state {state!r}"
    if reason is not None and reason not in _REASONS:
        return f"unknown reason {reason!r}"
    hex_digest = isinstance(fingerprint, str) and len(fingerprint) == 64 and set(fingerprint) <= set("0123456789abcdef")
    if not hex_digest:
        return f"fingerprint is not a SHA-256 hex digest: {fingerprint!r}"
    if not (isinstance(version, int) and version >= 1 and isinstance(attempts, int) and attempts >= 0):
        return f"bad version/attempts {version!r}/{attempts!r}"
    if not (isinstance(created_at, float | int) and isinstance(updated_at, float | int)):
        return "bad timestamps"
    return _bad_json(result, "result") or _bad_json(arguments, "arguments")


async def _verify_through_api(url: str, progress: Progress | None) -> VerifyReport:
    from . import create_journal
    from .transfer import iter_calls, iter_entries

    journal = create_journal(url)
    await journal.open()
    problems: list[Problem] = []
    records = 0
    try:
        try:
            async for record in iter_calls(journal):
                records += 1
                reason = _bad_json(record.result, "result") or _bad_json(record.arguments, "arguments")
                if reason:
                    i = record.identity
                    problems.append(Problem(f"{display_url(url)} ({i.principal} {i.tool}/{i.key})", -1, reason))
                if progress is not None:
                    progress(records, None)
            async for _entry in iter_entries(journal):
                records += 1
                if progress is not None:
                    progress(records, None)
        except (DurableError, ValueError, KeyError) as exc:
            problems.append(Problem(url, -1, f"unreadable after {records} record(s): {exc}"))
    finally:
        await journal.aclose()
    return VerifyReport(records, problems)


_BTREE_TYPES = {2: "index interior", 5: "table interior", 10: "index leaf", 13: "table leaf"}


def _walk_btrees(path: Path) -> list[Problem]:
    """Walk every table's and index's b-tree from its root page (read from the schema, page 1)
    and report each page whose header is not a b-tree page, with its byte offset."""
    data = path.read_bytes()
    if len(data) < 100 or not data.startswith(b"SQLite format 3\x00"):
        return [Problem(str(path), 0, "not a SQLite database header")]
    page_size = int.from_bytes(data[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = len(data) // page_size
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            roots = conn.execute("SELECT name, rootpage FROM sqlite_master WHERE rootpage > 0").fetchall()
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        return [Problem(str(path), 0, f"the schema (page 1) is unreadable: {exc}")]
    problems: list[Problem] = []
    seen: set[int] = set()
    for name, root in roots:
        stack = [int(root)]
        while stack:
            page = stack.pop()
            if page in seen or not 1 <= page <= pages:
                continue
            seen.add(page)
            start = (page - 1) * page_size
            header = start + (100 if page == 1 else 0)
            kind = data[header]
            if kind not in _BTREE_TYPES:
                reason = f"page {page} of {name}: not a b-tree page (type byte {kind:#04x} at offset {header})"
                problems.append(Problem(str(path), start, reason))
                continue
            if kind in (2, 5):  # interior: children in the cells, plus the right-most pointer
                cells = int.from_bytes(data[header + 3 : header + 5], "big")
                stack.append(int.from_bytes(data[header + 8 : header + 12], "big"))
                for i in range(cells):
                    pointer = int.from_bytes(data[header + 12 + 2 * i : header + 14 + 2 * i], "big")
                    stack.append(int.from_bytes(data[start + pointer : start + pointer + 4], "big"))
    return problems
