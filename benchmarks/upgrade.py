"""The upgrade trial: a journal written by an earlier release, opened (and migrated) by this one
while processes of the earlier release keep writing it.

    git worktree add /tmp/earlier b5a00a8       # the release to upgrade from
    python -m benchmarks.upgrade --earlier /tmp/earlier --records 1000000 [--output FILE]

For each journal (file, SQLite, Postgres) the earlier release builds `--records` COMPLETED
records once (its own `benchmarks.build`, cached under `--cache`); each trial copies that
journal, starts a process of the earlier release making durable misses on the copy with 8
callers (not for the file journal, which one process holds), opens the copy with this
release, and reports: the open (the migration included) and the read of the last record; the
longest call the earlier release's process made meanwhile and the calls that failed. Then the
same with the earlier release opening its own journal, for the baseline. Not part of `make
bench`: it needs a second tree. Results: docs/deployment.md ("Upgrades") and docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from .common import PG_BASE

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "_upgrade_child.py"
WRITERS = 8


def _child(tree: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(CHILD), *args], cwd=tree, env=_env(tree), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return {"failed": done.stderr.strip().splitlines()[-1][:400] if done.stderr.strip() else "no output"}
    report: dict[str, Any] = orjson.loads(done.stdout.splitlines()[-1])
    return report


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree)}


def _copy_postgres(source: str, target: str) -> None:
    """`source`'s tables, rows and indexes (by their names) in schema `target`."""
    import psycopg

    with psycopg.connect(PG_BASE, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{target}" CASCADE')
        conn.execute(f'CREATE SCHEMA "{target}"')
        tables = [row[0] for row in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (source,))]
        for table in tables:
            conn.execute(f'CREATE TABLE "{target}".{table} (LIKE "{source}".{table} INCLUDING ALL EXCLUDING INDEXES)')
            conn.execute(f'INSERT INTO "{target}".{table} OVERRIDING SYSTEM VALUE SELECT * FROM "{source}".{table}')
        for (definition,) in conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = %s", (source,)
        ).fetchall():
            conn.execute(definition.replace(f" ON {source}.", f' ON "{target}".'))
        conn.execute(
            f"SELECT setval(pg_get_serial_sequence('\"{target}\".entries', 'seq'), "
            f'coalesce((SELECT max(seq) FROM "{target}".entries), 0) + 1)'
        )
        conn.execute(f'VACUUM ANALYZE "{target}".calls')


def _drop_postgres(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_BASE, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def trial(backend: str, source: str, opener: Path, earlier: Path, records: int, scratch: Path) -> dict[str, Any]:
    """One copy of the built journal opened by `opener`'s tree beside a writer of `earlier`'s."""
    schema = f"{source}_trial"
    if backend == "postgres":
        _copy_postgres(source, schema)
        url = f"{PG_BASE}?schema={schema}"
    else:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.copytree(source, scratch)
        subprocess.run(["sync"], check=False)
        url = f"file://{scratch}/file" if backend == "file" else f"sqlite:///{scratch}/journal.db"
    writer = None
    try:
        if backend != "file":
            writer = subprocess.Popen(
                [sys.executable, str(CHILD), "write", url, str(WRITERS)],
                cwd=earlier,
                env=_env(earlier),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert writer.stdin is not None and writer.stdout is not None
            if writer.stdout.readline().strip() != "ready":
                raise RuntimeError("the earlier release's writer did not start")
            time.sleep(2)
        report = _child(opener, "open", url, str(records))
        if writer is not None:
            assert writer.stdin is not None
            time.sleep(2)
            writer.stdin.write("stop\n")
            writer.stdin.flush()
            out, _ = writer.communicate(timeout=300)
            report["earlier_writer"] = orjson.loads(out.splitlines()[-1])
        return report
    finally:
        if writer is not None and writer.poll() is None:
            writer.kill()
        if backend == "postgres":
            _drop_postgres(schema)
        else:
            shutil.rmtree(scratch, ignore_errors=True)


def _row(backend: str, who: str, report: dict[str, Any]) -> str:
    if "failed" in report:
        return f"| {backend} | {who} | failed: {report['failed']} | | | |"
    writer = report.get("earlier_writer")
    longest = "–" if writer is None else f"{writer['longest_s']:.2f} s"
    failed = "–" if writer is None else f"{writer['errors']} of {writer['calls']:,}"
    first = "" if writer is None or not writer["first_error"] else writer["first_error"][0][:120]
    applied = report.get("applied")
    migrated = f" (migrations {applied})" if applied else ""
    return (
        f"| {backend} | {who}{migrated} | {report['ready_s']:.2f} s | {report['peak_rss'] / 1e6:.0f} MB "
        f"| {longest} | {failed} {first} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--earlier", type=Path, required=True, help="a tree of the release to upgrade from")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--backends", default="file,sqlite,postgres")
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/mcp-durable-upgrade"))
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    earlier = args.earlier.resolve()
    lines = [
        f"Upgrade trial, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {args.records:,} records written by "
        f"{earlier}, opened by this tree; {WRITERS} callers of the earlier release writing meanwhile (SQL journals).",
        "",
        "| journal | opened by | open and read the last record | peak RSS | the earlier release's longest call "
        "| its calls that failed |",
        "|---|---|---|---|---|---|",
    ]
    for backend in args.backends.split(","):
        built = _child(earlier, "build", backend, str(args.records), str(args.cache))
        if "failed" in built:
            raise SystemExit(f"building the {backend} journal failed: {built['failed']}")
        print(f"{backend}: built in {built['seconds']:.0f} s", file=sys.stderr)
        for _ in range(args.trials):
            for who, tree in (("this release", ROOT), ("the earlier release", earlier)):
                report = trial(backend, built["source"], tree, earlier, args.records, args.cache / "trial")
                lines.append(_row(backend, who, report))
                print(lines[-1], file=sys.stderr)
    text = "\n".join(lines) + "\n"
    if args.output:
        args.output.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
