"""The MCP conformance suites from npm, run against a server's URL, their results read from the
files they write.

    results = await run_conformance(SERVER_SUITE, url, tmp_path / "direct", "--suite", "all")
    results = await run_scenarios(TASKS_SUITE, url, TASK_SCENARIOS, tmp_path / "run-1")
    failed(results)   # {(scenario, check id): message} of every check that failed

tests/node/package.json pins both versions under aliases (one package name, two versions):
`conformance-0-1` is `@modelcontextprotocol/conformance@0.1.16` (the 2025-11-25 server scenarios),
`conformance-tasks` is `0.2.0-alpha.12` (the tasks extension's scenarios, SEP-2663). The suite
runs as `node …/dist/index.js server --url URL -o DIR`; it writes one folder per scenario,
`server-<scenario>-<timestamp>/checks.json`, a list of checks with a `status` (`SUCCESS`,
`FAILURE`, `WARNING`, `INFO`, `SKIPPED`). Its exit status only says whether something failed, so
the checks are read instead. Missing node or packages skip the test, or fail it when `CI` is set
(`require_node_peers`). On Node.js before 22 the suite's bundle needs `node20_fs_glob.mjs`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio

from tests.node_peers import NODE_DIR, NODE_MODULES, require_node_peers

SERVER_SUITE = "conformance-0-1"
TASKS_SUITE = "conformance-tasks"
SHIM = Path(__file__).resolve().parent / "node20_fs_glob.mjs"
#: Ceiling for one run of the suite (its scenarios have their own 30 s timeouts).
RUN_TIMEOUT = 300.0
_FOLDER = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$")


@dataclass(frozen=True)
class Check:
    """One check of a scenario, as the suite wrote it."""

    id: str
    status: str
    message: str


#: What a run found: each scenario's checks, by scenario name.
Results = dict[str, list[Check]]


def suite_command(package: str) -> list[str]:
    """`node` running the suite `package` (skips, or fails under CI, without node or the package)."""
    node = require_node_peers()
    return [node, "--import", SHIM.as_uri(), str(NODE_MODULES / package / "dist" / "index.js")]


def read_results(folder: Path) -> Results:
    """The checks the suite wrote under `folder`, by scenario."""
    results: Results = {}
    for scenario_dir in sorted(folder.iterdir()):
        match = _FOLDER.match(scenario_dir.name)
        if match is None or not (scenario_dir / "checks.json").exists():
            continue
        checks = json.loads((scenario_dir / "checks.json").read_text())
        results[match["scenario"]] = [
            Check(c["id"], c["status"], c.get("errorMessage") or c.get("description", "")) for c in checks
        ]
    return results


async def run_conformance(package: str, url: str, folder: Path, *options: str) -> Results:
    """Run `conformance server --url url` of `package` with `options`; its results, by scenario."""
    folder.mkdir(parents=True, exist_ok=True)
    command = [*suite_command(package), "server", "--url", url, "-o", str(folder), *options]
    with anyio.fail_after(RUN_TIMEOUT):
        done = await anyio.run_process(command, cwd=NODE_DIR, check=False)
    results = read_results(folder)
    assert results, f"the suite wrote no results (exit {done.returncode}):\n{done.stdout.decode()[-4000:]}"
    return results


async def run_scenarios(package: str, url: str, scenarios: Sequence[str], folder: Path, *, at_once: int = 1) -> Results:
    """Each of `scenarios` in its own run of the suite (it runs one scenario, or a whole suite),
    `at_once` runs at a time (each in its own folder under `folder`)."""
    results: Results = {}
    limit = anyio.CapacityLimiter(at_once)

    async def one(scenario: str) -> None:
        async with limit:
            found = await run_conformance(package, url, folder / scenario, "--scenario", scenario)
        assert list(found) == [scenario], f"results for {scenario}: {sorted(found)}"
        results[scenario] = found[scenario]

    async with anyio.create_task_group() as group:
        for scenario in scenarios:
            group.start_soon(one, scenario)
    return results


def counted(results: Results) -> tuple[int, int]:
    """(passed, failed) checks, as the suite's own summary counts them."""
    statuses = [check.status for checks in results.values() for check in checks]
    return statuses.count("SUCCESS"), statuses.count("FAILURE")


def failed(results: Results) -> dict[tuple[str, str], str]:
    """Every failed check, `(scenario, check id) -> its message`."""
    return {
        (scenario, check.id): check.message
        for scenario, checks in results.items()
        for check in checks
        if check.status == "FAILURE"
    }


def outcomes(results: Results) -> dict[str, list[tuple[str, str]]]:
    """Each scenario's verdicts, `(check id, status)` sorted, without the suite's `INFO` lines
    (its log of the requests it sent and the answers it got)."""
    return {
        scenario: sorted((check.id, check.status) for check in checks if check.status != "INFO")
        for scenario, checks in results.items()
    }
