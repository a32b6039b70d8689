"""The tasks scenarios of the MCP conformance suite 0.2.0-alpha.12 (the tasks extension, SEP-2663)
against `DurableServer`, through `mcp-durable proxy` (each twice in a row on one journal) and on a
FastMCP server made durable (once).

The fixtures: tests/conformance/servers/tasks_fixtures.py. `serve`: its `DurableServer`, served as
a user serves it (`mcp-durable serve … --transport http --journal file://…`). `proxy`: its plain
`MCPServer` (no tasks of its own) as the stdio upstream of `mcp-durable proxy --transport http
--policies …`, whose policies give the same tools the same task support: the proxy serves the
tasks. `upstream-tasks`: its `DurableServer` (`mcp-durable serve`, stdio, a journal of its own),
which serves tasks itself, as the upstream of `mcp-durable proxy` without policies: the proxy
serves tasks of the tools the upstream declares task support for, and runs a tool the upstream
serves only as a task (`failing_job`, `required`) as the upstream's own task
(proxy/upstream_tasks.py). `fastmcp`: the same tools written for FastMCP 4 (servers/fastmcp_tasks_fixtures.py), their
tasks served by `DurableTasks`, the app served over streamable HTTP in this process on a new file
journal (one run: the restart is the other targets' second run, and test_tasks_restart.py's
for FastMCP). For the others, run 1 starts on a new file journal; the server is stopped;
run 2 starts a new one on the journal run 1 left (its finished, cancelled and failed tasks, and any
it left running, in doubt at the restart). A run's scenarios go three at a time, each a node
process of its own with its own connections. On `DurableServer` and on FastMCP every check passes
in every run, the four that need a task to ask its requestor for input (`input_required`,
SEP-2322) included: their interactive tools ask (docs/tasks.md, docs/fastmcp.md). Through the
proxy those four fail the way the suite says: the proxy serves no `input_required` (its plain
upstream's tools answer without asking; the `DurableServer` upstream's ask, and the question
reaches no client: `UPSTREAM_ASKS`). `tasks-status-notifications` is skipped by the suite itself (0
checks).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from mcp_durable.journal import CallQuery, create_journal
from tests.conformance.servers.tasks_fixtures import PROXY_POLICIES
from tests.conformance.suites import TASKS_SUITE, Results, counted, failed, run_scenarios
from tests.helpers import serve_app, serve_cli_http, serve_http
from tests.node_peers import require_node_peers

FIXTURES = "tests/conformance/servers/tasks_fixtures.py"
#: The suite's tasks scenarios (`conformance list --server`: the `[extension]` ones named tasks-*).
SCENARIOS = (
    "tasks-lifecycle",
    "tasks-capability-negotiation",
    "tasks-wire-fields",
    "tasks-request-state-removal",
    "tasks-mrtr-input",
    "tasks-request-headers",
    "tasks-dispatch-and-envelope",
    "tasks-status-notifications",
    "tasks-required-task-error",
    "tasks-mrtr-composition",
)
CHECKS = 44
#: Scenarios run at once, each by its own node process (its start-up alone takes about a second).
AT_ONCE = 3
#: The checks that need `input_required`, and what the suite reports when a task never asks
#: (through the proxy).
INPUT_REQUIRED = {
    ("tasks-mrtr-input", "sep-2663-tasks-get-status-input-required"): "confirm_delete did not create a task",
    ("tasks-mrtr-input", "tasks-mrtr-tasks-update-resumes"): "confirm_delete did not create a task",
    ("tasks-mrtr-input", "tasks-mrtr-partial-fulfillment"): "multi_input did not create a task",
    ("tasks-mrtr-composition", "sep-2663-mrtr-synchronous-before-task-creation"): "round 1 MUST be InputRequiredResult",
}


#: What the upstream's question gets: a task's run, and a 2026-07-28 client's call, go through the
#: proxy's upstream session that declares no capabilities (docs/proxy.md), whose SDK client answers it.
_CANNOT_ASK = "Elicitation not supported"
#: Through the proxy in front of the `DurableServer` fixtures, whose tools do ask: the upstream's
#: question reaches no client (a task's run has none; a 2026-07-28 client takes no server→client
#: request), so the checks that need a task to ask fail with that reason, and one check of
#: result types, which waits for `confirm_delete` to ask.
UPSTREAM_ASKS = {
    ("tasks-mrtr-input", "sep-2663-tasks-get-status-input-required"): _CANNOT_ASK,
    ("tasks-mrtr-input", "tasks-mrtr-tasks-update-resumes"): _CANNOT_ASK,
    ("tasks-mrtr-input", "tasks-mrtr-partial-fulfillment"): "multi_input did not create a task",
    ("tasks-mrtr-composition", "sep-2663-mrtr-synchronous-before-task-creation"): "Tool 'test_tool_with_task' requires",
    ("tasks-dispatch-and-envelope", "tasks-result-type-complete-on-non-task-responses"): _CANNOT_ASK,
}


#: The checks each target fails: none on `DurableServer` and FastMCP, those that need a task to
#: ask through the proxy.
FAILING: dict[str, dict[tuple[str, str], str]] = {
    "serve": {},
    "proxy": INPUT_REQUIRED,
    "upstream-tasks": UPSTREAM_ASKS,
    "fastmcp": {},
}


def _check(results: Results, target: str, run: str) -> None:
    assert sorted(results) == sorted(SCENARIOS), run
    failures = failed(results)
    expected = FAILING[target]
    assert sorted(failures) == sorted(expected), (run, failures)
    for check, message in expected.items():
        assert failures[check].startswith(message), (run, failures[check])
    assert counted(results) == (CHECKS - len(expected), len(expected)), run


async def _tasks_in(url: str) -> int:
    """How many records of `url`'s journal are tasks."""
    journal = create_journal(url)
    await journal.open()
    try:
        return len(await journal.list_calls(CallQuery(limit=10_000, tasks_only=True)))
    finally:
        await journal.aclose()


@asynccontextmanager
async def _served(target: str, journal: str, folder: Path) -> AsyncIterator[str]:
    """The URL of the fixtures served by `target` (`serve` or `proxy`) on `journal`."""
    if target == "serve":
        async with serve_http(FIXTURES, journal=journal) as served:
            yield served.url
        return
    if target == "fastmcp":
        from tests.fastmcp import servers  # skips (or fails under CI) without FastMCP

        assert servers.FastMCP is not None
        from tests.conformance.servers.fastmcp_tasks_fixtures import make_app

        async with serve_app(make_app(journal).http_app()) as base:
            yield f"{base}/mcp"
        return
    if target == "upstream-tasks":
        upstream_journal = f"file://{folder / 'upstream-journal'}"
        upstream = f"{sys.executable} -m mcp_durable.cli serve {FIXTURES} --journal {upstream_journal}"
        cli = ["proxy", "--upstream-command", upstream, "--journal", journal]
    else:
        policies = folder / "policies.toml"
        policies.write_text(PROXY_POLICIES)
        upstream = f"{sys.executable} {FIXTURES}"
        cli = ["proxy", "--upstream-command", upstream, "--policies", str(policies), "--journal", journal]
    async with serve_cli_http(cli) as served:
        yield served.url


#: Runs of the suite per target, each on the journal the run before left.
RUNS = {"serve": 2, "proxy": 2, "upstream-tasks": 2, "fastmcp": 1}


@pytest.mark.parametrize("target", list(RUNS))
async def test_the_tasks_scenarios_pass_in_a_row_on_one_journal(target: str, tmp_path: Path) -> None:
    require_node_peers()
    journal = f"file://{tmp_path / 'journal'}"
    tasks = [0]
    for run in range(1, RUNS[target] + 1):
        async with _served(target, journal, tmp_path) as url:
            results = await run_scenarios(TASKS_SUITE, url, SCENARIOS, tmp_path / f"run-{run}", at_once=AT_ONCE)
        _check(results, target, f"{target}, run {run}")
        tasks.append(await _tasks_in(journal))
    assert tasks == sorted(set(tasks)), f"the journal's tasks after each run: {tasks}"  # one journal, kept
