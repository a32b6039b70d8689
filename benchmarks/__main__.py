"""`python -m benchmarks [--quick] [--cases 1,2,…] [--output PATH]`: run the suite, print, publish.

The full run writes `docs/benchmarks.md`; `--quick` (a smoke run for CI: small samples, no
1,000,000-record recovery) writes only where `--output` says. The exit status is non-zero when
a case fails (an error, never a figure).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import os
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from .common import CaseResult, Settings, cleanup_postgres, machine, make_settings, remove_workdir
from .report import console, print_table, targets_table, write_markdown

#: Case number -> (title, module); each module has `async def run(settings) -> CaseResult`.
CASES: dict[str, tuple[str, str]] = {
    "1": ("latency", "latency"),
    "2": ("throughput", "throughput"),
    "3": ("journal appends", "appends"),
    "4": ("recovery", "recovery"),
    "5": ("streamable HTTP", "http"),
    "6": ("bytes on disk", "disk"),
    "7": ("proxy", "proxy"),
    "8": ("MCP tasks", "tasks"),
    "9": ("peers side by side", "peers"),
    "10": ("capacity of one Postgres", "capacity"),
    "11": ("retention", "retention"),
    "12": ("scale", "scale"),
    "13": ("retention at scale", "retention_scale"),
    "14": ("FastMCP side by side", "fastmcp_peers"),
}
DEFAULT_OUTPUT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small samples, skip the 1M recovery")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case numbers (default: all)")
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help=f"markdown report path (default: {DEFAULT_OUTPUT} for a full run, none for --quick)",
    )
    return parser.parse_args(argv)


async def main_async(args: argparse.Namespace) -> int:
    started = dt.datetime.now(dt.UTC)
    settings = make_settings(args.quick)
    facts = machine(settings.fsync_s)
    console.rule(f"mcp-durable benchmarks {'(quick)' if args.quick else ''}")
    for key, value in facts.items():
        console.print(f"{key}: {value}")
    results: list[CaseResult] = []
    failed: list[str] = []
    try:
        for number in [c.strip() for c in args.cases.split(",") if c.strip()]:
            if number not in CASES:
                console.print(f"[red]unknown case {number!r}[/red]")
                return 2
            title, module = CASES[number]
            console.rule(f"case {number}: {title}")
            began = time.perf_counter()
            try:
                run: Callable[[Settings], Awaitable[CaseResult]] = importlib.import_module(
                    f"{__package__}.{module}"
                ).run
                result = await run(settings)
            except Exception:  # noqa: BLE001 - report every case, then fail the run
                console.print(f"[red]case {number} ({title}) failed:[/red]\n{traceback.format_exc()}")
                failed.append(number)
                continue
            result.seconds = time.perf_counter() - began
            for table in result.tables:
                print_table(table)
            console.print(f"(case {number} took {result.seconds:.1f} s)")
            results.append(result)
    finally:
        cleanup_postgres()
        remove_workdir(settings)
    if hasattr(os, "getloadavg"):
        facts["load average at end"] = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    facts["run time"] = f"{(dt.datetime.now(dt.UTC) - started).total_seconds():.0f} s"
    targets = [t for r in results for t in r.targets]
    if targets:
        print_table(targets_table(targets))
    output = args.output if args.output is not None else (None if args.quick else DEFAULT_OUTPUT)
    if output is not None and results:
        command = "python -m benchmarks" + (" --quick" if args.quick else "")
        write_markdown(output, machine=facts, results=results, quick=args.quick, started=started, command=command)
        console.print(f"wrote {output}")
    if failed:
        console.print(f"[red]failed cases: {', '.join(failed)}[/red]")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    return anyio.run(main_async, args)


if __name__ == "__main__":
    sys.exit(main())
