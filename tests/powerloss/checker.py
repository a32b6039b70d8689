"""The checker: opens a journal left by a simulated power loss and reports what it finds.

`python -m tests.powerloss.checker` reads one JSON request per line on stdin and answers one
JSON line per request on stdout, so one process checks many states (the harness kills it and
starts another if a state makes it hang). A request:

    {"kind": "file"|"sqlite", "root": DIR, "acks": [[principal, tool, key, payload, failed, expires, at]],
     "claims": [[principal, tool, key, expires]], "steps": [[process_id, index, result]]}

For each state, in order:
1. `mcp-durable journal verify` (the CLI's own `main`, on a copy for SQLite, whose verify
   connection checkpoints the WAL when it closes) — exit code and problems;
2. the next boot: `Engine(journal).start()` (recovery, then orphaned claims marked in doubt);
   a `DurableError` is a refusal (its message is reported), any other exception a crash;
3. every acknowledged result read back (`get`), every durable claim looked up, every
   acknowledged durable step read back (`entries(process_id=…)`), and the counts and open and
   task listings the journal keeps compared with its records (`tests/journal_kept.py`);
4. the journal closed, and `journal verify` again.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any

import anyio
import orjson

from mcp_durable import Engine
from mcp_durable.cli.commands import main as cli_main
from mcp_durable.errors import DurableError
from mcp_durable.journal import CallIdentity, CallState
from mcp_durable.journal.base import Journal

from ..journal_kept import kept_disagreements
from .workload import journal_path

FINAL = {CallState.COMPLETED.value, CallState.FAILED.value}


def journal_url(kind: str, root: Path) -> str:
    path = journal_path(kind, root)
    return f"file://{path}" if kind == "file" else f"sqlite:///{path}"


def journal_exists(kind: str, root: Path) -> bool:
    """Whether the state holds a journal to verify at all (else `verify` rightly says "none")."""
    path = journal_path(kind, root)
    if kind == "sqlite":
        return path.is_file() and path.stat().st_size > 0
    # Empty segments without a manifest are a creation cut short, which opens as a new journal.
    return path.is_dir() and any(
        p.name == "MANIFEST" or (p.name.startswith("seg-") and p.stat().st_size) for p in path.iterdir()
    )


def kept_aside(kind: str, root: Path) -> list[str]:
    """The damaged ranges a recovery reported and copied aside (`<segment>.damaged-<offset>`)."""
    path = journal_path(kind, root)
    if kind != "file" or not path.is_dir():
        return []
    return sorted(p.name for p in path.iterdir() if ".damaged-" in p.name)


def sqlite_schema_exists(path: Path) -> bool:
    """Whether the database holds the journal's tables (else its creation was cut short)."""
    import sqlite3

    try:
        conn = sqlite3.connect(path)  # on a copy: reading through the WAL may checkpoint it
        try:
            return conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'calls'").fetchone() is not None
        finally:
            conn.close()
    except sqlite3.Error:
        return True  # unreadable: a damaged journal, which verify must report


def run_verify(url: str) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli_main(["journal", "verify", "--journal", url, "--json"])
        except SystemExit as exc:
            code = int(exc.code or 0)
        except Exception as exc:  # noqa: BLE001 - reported: verify itself must not crash
            return {"exit": -1, "problems": [], "crash": "".join(traceback.format_exception(exc))}
    problems = [orjson.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]
    return {"exit": code, "problems": problems, "stderr": err.getvalue()[-500:]}


def open_journal(kind: str, root: Path) -> Journal:
    from mcp_durable.journal import create_journal

    return create_journal(journal_url(kind, root))


def check(request: dict[str, Any]) -> dict[str, Any]:
    """Verify, boot, read back, close, verify (the CLI runs its own event loop: not inside ours)."""
    kind, root = request["kind"], Path(request["root"])
    url = journal_url(kind, root)
    report: dict[str, Any] = {"exists": journal_exists(kind, root)}
    if kind == "sqlite":
        copy = root.with_name(root.name + "-verify")
        shutil.copytree(root, copy)
        report["verify_before"] = run_verify(journal_url(kind, copy))
        shutil.rmtree(copy)
        shutil.copytree(root, copy)
        report["exists"] = report["exists"] and sqlite_schema_exists(journal_path(kind, copy))
        shutil.rmtree(copy)
    else:
        report["verify_before"] = run_verify(url)
    report["kept_aside_before"] = kept_aside(kind, root)
    anyio.run(boot, request, report)
    if report["outcome"] == "opened":
        report["verify_after"] = run_verify(url)
        report["kept_aside_after"] = kept_aside(kind, root)
    return report


async def boot(request: dict[str, Any], report: dict[str, Any]) -> None:
    """The next boot of the state, recorded in `report`: its outcome ("opened", "refused" or
    "crash", with the error), and once opened the repairs recovery made, the orphaned claims
    it marked in doubt, what it lost of `request`'s acks, claims and steps (what was found
    lost before a crash while reading back is kept), and where its kept counts and listings
    disagree with its records."""
    kind, root = request["kind"], Path(request["root"])
    journal = open_journal(kind, root)
    engine = Engine(journal)
    if not await _start(engine, report):
        return
    recovery = journal.recovery
    report["problems"] = list(recovery.problems) if recovery is not None else []
    report["orphans_in_doubt"] = engine.orphans_found
    lost_acks: list[list[Any]] = []
    lost_claims: list[list[Any]] = []
    lost_steps: list[list[Any]] = []
    kept_off: list[str] = []
    try:
        await _find_lost_acks(journal, request["acks"], lost_acks)
        await _find_lost_claims(journal, request["claims"], lost_claims)
        await _find_lost_steps(journal, request["steps"], lost_steps)
        kept_off += await kept_disagreements(journal)
    except Exception as exc:  # noqa: BLE001 - reading back what recovery kept must not fail
        report["outcome"] = "crash"
        report["error"] = "reading back: " + "".join(traceback.format_exception(exc))
    finally:
        with contextlib.suppress(Exception):
            await engine.aclose()
    report.update(lost_acks=lost_acks, lost_claims=lost_claims, lost_steps=lost_steps, kept_off=kept_off)


async def _start(engine: Engine, report: dict[str, Any]) -> bool:
    """Start the engine (recovery included); records the outcome in `report` and returns whether
    it opened. A `DurableError` is a refusal, any other exception a crash."""
    try:
        await engine.start()
    except DurableError as exc:
        report["outcome"] = "refused"
        report["error"] = f"{type(exc).__name__}: {exc}"
        return False
    except Exception as exc:  # noqa: BLE001 - a crash is what the harness counts
        report["outcome"] = "crash"
        report["error"] = "".join(traceback.format_exception(exc))
        return False
    report["outcome"] = "opened"
    return True


async def _find_lost_acks(journal: Journal, acks: list[list[Any]], lost: list[list[Any]]) -> None:
    """Append to `lost` each acknowledged result the journal no longer holds as acknowledged:
    absent, in another state, or with other bytes. A result whose retention ended is not lost
    when it is absent, nor when its key was claimed afresh after it (workload clock)."""
    for principal, tool, key, payload, failed, expires, at in acks:
        record = await journal.get(CallIdentity(principal, tool, key))
        if record is None:
            if not expires:
                lost.append([tool, key, "absent"])
            continue
        if expires and record.created_at > at:
            continue  # its retention ended and the key was claimed afresh (workload clock)
        want = CallState.FAILED.value if failed else CallState.COMPLETED.value
        if record.state.value != want:
            lost.append([tool, key, f"state {record.state.value}, acknowledged {want}"])
        elif record.result != payload.encode():
            lost.append([tool, key, "result differs from the acknowledged bytes"])


async def _find_lost_claims(journal: Journal, claims: list[list[Any]], lost: list[list[Any]]) -> None:
    """Append to `lost` each durable claim (of a tool without retention) the journal no longer holds."""
    for principal, tool, key, expires in claims:
        if not expires and await journal.get(CallIdentity(principal, tool, key)) is None:
            lost.append([tool, key])


async def _find_lost_steps(journal: Journal, steps: list[list[Any]], lost: list[list[Any]]) -> None:
    """Append to `lost` each acknowledged durable step whose result the journal no longer holds
    (the step entries of each process are read once)."""
    by_process: dict[str, dict[int, Any]] = {}
    for process_id, index, result in steps:
        if process_id not in by_process:
            entries = await journal.entries(process_id=process_id)
            by_process[process_id] = {e.data["index"]: e.data["result"] for e in entries if e.entry_type == "step"}
        if by_process[process_id].get(index, KeyError) != result:
            lost.append([process_id, index])


def main() -> None:
    for line in sys.stdin:
        request = orjson.loads(line)
        try:
            answer = check(request)
        except Exception as exc:  # noqa: BLE001 - never leave the harness waiting
            answer = {"outcome": "crash", "error": "".join(traceback.format_exception(exc))}
        sys.stdout.write(orjson.dumps(answer).decode() + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
