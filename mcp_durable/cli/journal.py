"""`mcp-durable journal …`: inspect and operate a journal from the shell.

    mcp-durable journal [--journal URL] [--json] stats | list | show | tail | verify | compact
                                                 | export FILE | import FILE | resolve | forget | rerun | cancel

Data goes to stdout (rich tables, or with `--json` one JSON object per line), messages and
progress to stderr. Exit 0 ok, 1 a `DurableError` (or a corrupt journal for `verify`), 2 a usage
error; no traceback without `--debug`. Reading commands open a file journal read-only
(`?mode=ro`), so they work while a server holds it; SQLite and Postgres serve readers anyway.
Values a tool marks sensitive are masked (the server journals its tools' sensitive names).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import orjson

from ..engine.operators import RESOLUTIONS
from ..errors import CallNotFoundError, ConfigError, DurableError, JournalError
from ..journal import CallIdentity, CallRecord, CallState, Journal, create_journal, default_journal_url, display_url
from ..journal.base import Maintainable

if TYPE_CHECKING:
    from ..engine import Engine

Handler = Callable[[argparse.Namespace], Awaitable[int]]


class UsageError(Exception):
    """A command line that cannot be acted on (exit 2)."""


# -- plumbing ---------------------------------------------------------------------------------------


def read_only_url(url: str) -> str:
    """`url` as a reader beside a running server opens it: a file journal read-only (`?mode=ro`),
    so the writer's lock is never taken to read; SQLite and Postgres serve readers anyway."""
    if url.lower().startswith("file:") and "mode=" not in url:
        url += ("&" if "?" in url else "?") + "mode=ro"
    return url


def _url(args: argparse.Namespace, *, read_only: bool) -> str:
    # Without --journal: $MCP_DURABLE_JOURNAL (the command trusts the environment: `cli.main`).
    url = getattr(args, "journal_url", None) or default_journal_url()
    return read_only_url(url) if read_only else url


async def _open(args: argparse.Namespace, *, read_only: bool = True) -> Journal:
    journal = create_journal(_url(args, read_only=read_only))
    await journal.open()
    return journal


def _wants_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


def _emit_json(obj: Any) -> None:
    sys.stdout.write(orjson.dumps(obj).decode() + "\n")
    sys.stdout.flush()


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, soft_wrap=not stderr)


def _say(message: str) -> None:
    print(f"mcp-durable: {message}", file=sys.stderr)


def _table(title: str | None, columns: list[str], rows: list[list[Any]]) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title) if title else None, show_lines=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        # Data is never markup: "[redacted]" must print as itself.
        table.add_row(*("" if value is None else escape(str(value)) for value in row))
    _console().print(table)


def _progress(description: str, total: int | None) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=_console(stderr=True),
        transient=False,
    )


def _run(handler: Handler) -> Callable[[argparse.Namespace], int]:
    """Run an async command; usage errors exit 2, unexpected errors 1 (traceback only with --debug)."""

    def run(args: argparse.Namespace) -> int:
        try:
            return anyio.run(handler, args)
        except UsageError as exc:
            _say(f"error: {exc}")
            return 2
        except DurableError:
            raise  # cli.main prints it and exits 1
        except (OSError, ValueError) as exc:
            if getattr(args, "debug", False):
                raise
            _say(f"error: {exc}")
            return 1

    return run


async def _sensitive(journal: Journal) -> dict[str, tuple[str, ...]]:
    from ..views import SensitiveNames

    return await SensitiveNames.load(journal)


async def _find(journal: Journal, tool: str, key: str, principal: str | None) -> list[CallRecord]:
    """The records of (tool, key): of `principal` if given, else of every principal (newest
    first), each found through the journal's index, never by reading the tool's other calls."""
    if principal is not None:
        record = await journal.get(CallIdentity(principal, tool, key))
        return [] if record is None else [record]
    return await journal.find_calls(tool, key)


async def _one_record(journal: Journal, args: argparse.Namespace) -> CallRecord:
    """The one record an operator command acts on (`args.tool`, `args.key`, `args.principal`)."""
    records = await _find(journal, args.tool, args.key, args.principal)
    if not records:
        raise CallNotFoundError(args.tool, args.key)
    if len(records) > 1:
        owners = ", ".join(r.identity.principal for r in records)
        raise UsageError(f"{args.tool}/{args.key} exists for several principals ({owners}): pass --principal")
    return records[0]


# -- commands ---------------------------------------------------------------------------------------


async def _stats(args: argparse.Namespace) -> int:
    from ..views import iso

    journal = await _open(args)
    try:
        stats = await journal.stats()
    finally:
        await journal.aclose()
    body = {
        "backend": stats.backend,
        "calls": sum(stats.calls_by_state.values()),
        "calls_by_state": stats.calls_by_state,
        "calls_by_tool": stats.calls_by_tool,
        "entries": stats.entries,
        "size_bytes": stats.size_bytes,
        "oldest_record_at": iso(stats.oldest_record_at),
    }
    if _wants_json(args):
        _emit_json(body)
        return 0
    rows = [[name, body[name]] for name in ("backend", "calls", "entries", "size_bytes", "oldest_record_at")]
    rows += [[f"state {state}", n] for state, n in sorted(stats.calls_by_state.items())]
    rows += [[f"tool {tool}", n] for tool, n in sorted(stats.calls_by_tool.items())]
    _table(f"journal {display_url(_url(args, read_only=False))}", ["what", "value"], rows)
    return 0


def _state(value: str | None) -> CallState | None:
    if value is None:
        return None
    try:
        return CallState(value)
    except ValueError:
        raise UsageError(f"--state must be one of {', '.join(s.value for s in CallState)}") from None


async def _list(args: argparse.Namespace) -> int:
    from ..journal.transfer import iter_calls
    from ..views import record_summary

    state = _state(args.state)
    journal = await _open(args)
    rows: list[dict[str, Any]] = []
    try:
        filters = {"tasks_only": True} if args.tasks else {}
        async for record in iter_calls(journal, principal=args.principal, tool=args.tool, state=state, **filters):
            rows.append(record_summary(record))
            if args.limit and len(rows) >= args.limit:
                break
    finally:
        await journal.aclose()
    if _wants_json(args):
        for row in rows:
            _emit_json(row)
        return 0
    columns = ["created_at", "principal", "tool", "key", "state", "attempts"]
    if args.tasks:
        columns.insert(5, "task_status")
    _table(None, columns, [[row[c] for c in columns] for row in rows])
    _say(f"{len(rows)} {'task' if args.tasks else 'call'}(s)")
    return 0


async def _show(args: argparse.Namespace) -> int:
    from ..views import record_view

    journal = await _open(args)
    try:
        records = await _find(journal, args.tool, args.key, args.principal)
        sensitive = await _sensitive(journal)
    finally:
        await journal.aclose()
    if not records:
        whose = f" of principal {args.principal}" if args.principal else ""
        raise DurableError(f"no call {args.tool}/{args.key}{whose}")
    for record in records:
        view = record_view(record, sensitive.get(record.identity.tool, ()))
        if _wants_json(args):
            _emit_json(view)
        else:
            rows = [
                [name, orjson.dumps(value).decode() if isinstance(value, dict | list) else value]
                for name, value in view.items()
            ]
            i = record.identity
            _table(f"{i.principal} {i.tool}/{i.key}", ["field", "value"], rows)
    return 0


def _print_entries(args: argparse.Namespace, entries: list[Any]) -> None:
    from ..views import iso

    for entry in entries:
        line = {
            "seq": entry.seq,
            "ts": iso(entry.ts),
            "process_id": entry.process_id,
            "entry_type": entry.entry_type,
            "data": entry.data,
        }
        if _wants_json(args):
            _emit_json(line)
        else:
            _console().print(
                f"{entry.seq:>8} {line['ts']} {entry.process_id} {entry.entry_type} "
                f"{orjson.dumps(entry.data).decode()}",
                markup=False,
                highlight=False,
            )


async def _tail(args: argparse.Namespace) -> int:
    journal = await _open(args)
    try:
        if args.after is not None:
            after = args.after
        else:  # the last N entries: find the end without reading the whole log into memory
            from ..journal.transfer import iter_entries

            last: list[Any] = []
            end = 0
            async for entry in iter_entries(journal):
                end = entry.seq
                last.append(entry)
                if len(last) > args.lines:
                    last.pop(0)
            after = last[0].seq - 1 if last else end
        while True:
            entries = await journal.entries(after=after, limit=1000)
            _print_entries(args, entries)
            if entries:
                after = entries[-1].seq
                continue
            if not args.follow:
                return 0
            await anyio.sleep(args.interval)
            if journal.single_writer:  # a read-only file journal sees the writer's appends on reopen
                await journal.aclose()
                journal = await _open(args)
    finally:
        await journal.aclose()


async def _verify(args: argparse.Namespace) -> int:
    from ..journal.integrity import verify_url

    url = _url(args, read_only=True)
    with _progress("verifying", None) as bar:
        task = bar.add_task("verifying", total=None)
        report = await verify_url(url, lambda done, total: bar.update(task, completed=done, total=total))
    for problem in report.problems:
        if _wants_json(args):
            _emit_json({"path": problem.path, "offset": problem.offset, "reason": problem.reason})
        else:
            _console().print(
                f"CORRUPT {problem.path} at offset {problem.offset}: {problem.reason}", markup=False, highlight=False
            )
    if report.ok:
        _say(f"ok: {report.records} record(s) verified")
        return 0
    _say(f"corrupt: {len(report.problems)} problem(s) in {report.records} record(s) read")
    return 1


async def _compact(args: argparse.Namespace) -> int:
    journal = await _open(args, read_only=False)
    try:
        now = time.time()
        with _console(stderr=True).status("compacting"):
            if isinstance(journal, Maintainable):
                body = (await journal.compact(now)).as_dict()
            else:
                body = {"purged": await journal.purge_expired(now)}
    finally:
        await journal.aclose()
    if _wants_json(args):
        _emit_json(body)
    else:
        _say(f"compacted: {orjson.dumps(body, default=str).decode()}")
    return 0


async def _export(args: argparse.Namespace) -> int:
    from ..journal.transfer import export_journal, open_export_file, totals

    journal = await _open(args)
    try:
        calls, entries = await totals(journal)
        target = Path(args.file)
        with open_export_file(target) as out, _progress("export", calls + entries) as bar:
            task = bar.add_task(f"export to {target}", total=calls + entries)
            counts = await export_journal(journal, out, lambda n: bar.advance(task, n))
    finally:
        await journal.aclose()
    _say(f"exported {counts.calls} call record(s) and {counts.entries} entries to {args.file}")
    return 0


async def _import(args: argparse.Namespace) -> int:
    from ..journal.transfer import import_journal, read_header

    source = Path(args.file)
    if not source.is_file():
        raise UsageError(f"no such file: {args.file}")
    journal = await _open(args, read_only=False)
    try:
        with source.open("rb") as lines:
            header = read_header(lines.readline())
            total = int(header.get("calls", 0)) + int(header.get("entries", 0))
            with _progress("import", total) as bar:
                task = bar.add_task(f"import from {source}", total=total)
                counts = await import_journal(journal, lines, lambda n: bar.advance(task, n))
    finally:
        await journal.aclose()
    for identity in counts.skipped_identities[:20]:
        _say(f"kept the existing record {identity.principal} {identity.tool}/{identity.key}")
    _say(
        f"imported {counts.calls} call record(s) and {counts.entries} entries; {counts.skipped} already present"
        + (f", and {counts.skipped_entries} entries already present" if counts.skipped_entries else "")
    )
    return 0


async def _resolve(args: argparse.Namespace) -> int:
    from ..engine import Engine
    from ..server.admin import operator_payload
    from ..views import record_view

    result: Any = None
    if args.result is not None:
        try:
            result = orjson.loads(args.result)
        except orjson.JSONDecodeError as exc:
            raise UsageError(f"--result is not JSON: {exc}") from None
    if args.resolution == "completed" and args.result is None:
        raise UsageError("resolving as completed needs --result JSON (what repeats of the key will replay)")
    journal = await _open(args, read_only=False)
    try:
        record = await _one_record(journal, args)
        payload = (
            None
            if args.resolution == "not_applied"
            else operator_payload(result, failed=args.resolution == "failed", note=args.note)
        )
        resolved = await Engine(journal).resolve(
            record.identity,
            args.resolution,
            payload=payload,
            note=args.note or "mcp-durable journal resolve",
            by=_operator(),
        )
        sensitive = await _sensitive(journal)
    finally:
        await journal.aclose()
    view = record_view(resolved, sensitive.get(args.tool, ()))
    if _wants_json(args):
        _emit_json(view)
    else:
        _say(
            f"resolved {resolved.identity.principal} {args.tool}/{args.key} as {args.resolution}: "
            f"now {resolved.state.value}"
        )
    return 0


async def _operate(
    args: argparse.Namespace, act: Callable[[Engine, CallIdentity], Awaitable[CallRecord]], said: str
) -> int:
    """An operator action on the one record `args` name: `act` through an engine on the journal,
    then the record (masked) as JSON or `said` (formatted with `who`) as a message."""
    from ..engine import Engine
    from ..views import record_view

    journal = await _open(args, read_only=False)
    try:
        record = await _one_record(journal, args)
        after = await act(Engine(journal), record.identity)
        sensitive = await _sensitive(journal)
    finally:
        await journal.aclose()
    if _wants_json(args):
        _emit_json(record_view(after, sensitive.get(args.tool, ())))
    else:
        _say(said.format(who=f"{after.identity.principal} {args.tool}/{args.key}"))
    return 0


async def _forget(args: argparse.Namespace) -> int:
    return await _operate(
        args,
        lambda engine, identity: engine.forget(identity, by=_operator(), note=args.note),
        "forgot {who}: the next call with this key runs anew",
    )


async def _cancel(args: argparse.Namespace) -> int:
    return await _operate(
        args,
        lambda engine, identity: engine.cancel(identity, by=_operator(), note=args.note),
        "cancelled {who}: its owner stops it at its next lease renewal or durable step",
    )


async def _rerun(args: argparse.Namespace) -> int:
    start = "" if args.from_step is None else f" from step {args.from_step}"
    return await _operate(
        args,
        lambda engine, identity: engine.rerun(identity, from_step=args.from_step, by=_operator(), note=args.note),
        f"re-run {{who}}{start}: the next call with this key runs it",
    )


def _operator() -> str:
    """Who acts from the shell, for the audit entry: the OS user."""
    import getpass

    try:
        return f"cli:{getpass.getuser()}"
    except (OSError, KeyError):
        return "cli"


# -- the parser -------------------------------------------------------------------------------------


def _common() -> argparse.ArgumentParser:
    # SUPPRESS defaults: the options work before and after the subcommand without one
    # level's default overwriting the other's value.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--journal",
        dest="journal_url",
        default=argparse.SUPPRESS,
        help="journal URL (default: $MCP_DURABLE_JOURNAL or the embedded journal)",
    )
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="one JSON object per line")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    return common


def add_journal_commands(subparsers: Any) -> None:
    """Add `journal` and its subcommands to the `mcp-durable` parser."""
    common = _common()
    journal = subparsers.add_parser("journal", parents=[common], help="inspect and operate a journal")
    commands = journal.add_subparsers(dest="journal_command", required=True, metavar="COMMAND")

    def command(name: str, handler: Handler, help: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = commands.add_parser(name, parents=[common], help=help, description=help)
        parser.set_defaults(handler=_run(handler))
        return parser

    command("stats", _stats, "counts by state and tool, size, oldest record")
    listing = command("list", _list, "call records, newest first")
    listing.add_argument("--tool")
    listing.add_argument("--state", help=", ".join(s.value for s in CallState))
    listing.add_argument("--principal")
    listing.add_argument("--tasks", action="store_true", help="only calls that are MCP tasks, with their task status")
    listing.add_argument("--limit", type=int, default=100, help="at most this many (0: all; default 100)")
    show = command("show", _show, "one call record (masked where its tool says so)")
    show.add_argument("tool")
    show.add_argument("key")
    show.add_argument("--principal", help="whose record (default: every principal's)")
    tail = command("tail", _tail, "the process-log tail")
    tail.add_argument("-n", "--lines", type=int, default=20, help="how many of the last entries (default 20)")
    tail.add_argument("--after", type=int, help="entries after this sequence number instead")
    tail.add_argument("-f", "--follow", action="store_true", help="keep printing new entries")
    tail.add_argument("--interval", type=float, default=0.5, help="seconds between polls with --follow")
    command("verify", _verify, "check every record and checksum; exit 1 on corruption")
    command("compact", _compact, "drop expired records (file journal: rewrite its segments)")
    export = command("export", _export, "write every record and entry to FILE (JSON lines)")
    export.add_argument("file")
    importing = command("import", _import, "insert the records and entries of an export FILE")
    importing.add_argument("file")
    resolve = command("resolve", _resolve, "an operator's verdict on a call in doubt")
    resolve.add_argument("tool")
    resolve.add_argument("key")
    resolve.add_argument("--as", dest="resolution", required=True, choices=RESOLUTIONS)
    resolve.add_argument("--result", help="the JSON result repeats will replay (completed, failed)")
    resolve.add_argument("--principal", help="whose record (needed when several principals used the key)")
    resolve.add_argument("--note", default="", help="why, kept in the record's error field")
    forget = command("forget", _forget, "forget a call in doubt: the next call with its key runs anew")
    forget.add_argument("tool")
    forget.add_argument("key")
    forget.add_argument("--principal", help="whose record (needed when several principals used the key)")
    forget.add_argument("--note", default="", help="why, kept in the audit entry and the record's error field")
    cancel = command("cancel", _cancel, "cancel a running call: its owner stops it; it is never resumed")
    cancel.add_argument("tool")
    cancel.add_argument("key")
    cancel.add_argument("--principal", help="whose record (needed when several principals used the key)")
    cancel.add_argument("--note", default="", help="why, kept in the audit entry and the record's error field")
    rerun = command("rerun", _rerun, "re-run a completed or failed call: the next call with its key runs it again")
    rerun.add_argument("tool")
    rerun.add_argument("key")
    rerun.add_argument("--from-step", type=int, help="replay the durable steps before this index, run the rest")
    rerun.add_argument("--principal", help="whose record (needed when several principals used the key)")
    rerun.add_argument("--note", default="", help="why, kept in the audit entry and the record's error field")


__all__ = ["ConfigError", "JournalError", "UsageError", "add_journal_commands", "read_only_url"]
