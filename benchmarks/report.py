"""Printing tables (rich) and writing `docs/benchmarks.md`."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable

from .common import CaseResult, Table, Target

# Wide enough for the tables when the output is a file or a CI log rather than a terminal.
console = Console(width=None if Console().is_terminal else 200)


def print_table(table: Table) -> None:
    rich = RichTable(
        title=escape(table.title),
        title_justify="left",
        caption_justify="left",
        caption=escape("\n".join(table.notes)) or None,
    )
    for i, column in enumerate(table.columns):
        rich.add_column(column, justify="left" if i == 0 else "right")
    for row in table.rows:
        rich.add_row(*[_colour(cell) for cell in row])
    console.print(rich)


def targets_table(targets: Sequence[Target]) -> Table:
    table = Table("Targets (ratios from this run)", ["target", "bar", "measured", "verdict"])
    for target in targets:
        table.add(target.name, target.bar, target.measured, target.verdict)
    return table


def _colour(cell: str) -> str:
    if cell == "met":
        return "[green]met[/green]"
    if cell == "NOT met":
        return "[red]NOT met[/red]"
    return escape(cell)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(table: Table, level: str = "##") -> str:
    lines = [f"{level} {table.title}", ""]
    lines.append("| " + " | ".join(_md_cell(c) for c in table.columns) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(table.columns) - 1)) + "|")
    for row in table.rows:
        lines.append("| " + " | ".join(_md_cell(c) for c in row) + " |")
    if table.notes:
        lines.append("")
        lines.extend(f"- {note}" for note in table.notes)
    return "\n".join(lines)


def write_markdown(
    path: Path,
    *,
    machine: dict[str, str],
    results: Sequence[CaseResult],
    quick: bool,
    started: dt.datetime,
    command: str,
) -> None:
    """Write the whole report: when, where, the targets, then every case's tables."""
    targets = [t for r in results for t in r.targets]
    met = sum(1 for t in targets if t.met)
    missed = [t for t in targets if t.met is False]
    unmeasured = [t for t in targets if t.met is None]
    out = [
        "# Benchmarks",
        "",
        f"Written by `{command}` on {started:%Y-%m-%d} at {started:%H:%M} UTC"
        + (" (quick mode: small samples, no 1,000,000-record recovery)" if quick else "")
        + ". Every ratio compares figures measured side by side in the same run; the machine is",
        "shared with other work, so absolute figures are noisy and the ratios are what to read.",
        "Regenerate with `make bench` (full) or `make bench-quick` (smoke run). What the figures mean for a",
        "deployment: [performance.md](performance.md); why the targets not met yet are not, measured piece by",
        "piece: [dev/performance-notebook.md](dev/performance-notebook.md).",
        "",
        "## Machine",
        "",
        *[f"- {k}: {v}" for k, v in machine.items()],
        "",
        f"## Summary: {met} of {len(targets)} targets met",
        "",
    ]
    if missed:
        out.append("Not met yet: " + "; ".join(t.name for t in missed) + ".")
        out.append("")
    if unmeasured:
        out.append("Not measured in this run: " + "; ".join(t.name for t in unmeasured) + ".")
        out.append("")
    out.append(markdown_table(targets_table(targets), level="###"))
    out.append("")
    for result in results:
        for table in result.tables:
            out.append(markdown_table(table))
            out.append("")
        out.append(f"_(case took {result.seconds:.0f} s)_")
        out.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out).rstrip() + "\n", encoding="utf-8")
