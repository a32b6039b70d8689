"""Every command and Python program shown in the docs runs, or a named test runs it.

For each document (README.md, docs/*.md, examples/*.md), in a fresh directory laid out like a
clone (tools/, examples/, .venv linked in; no journal yet):
- each ```python block runs as a program, in order, and must exit 0;
- each command of a ```sh or ```console block either
  - is listed in `ELSEWHERE`, mapped to the test (or `.ci/run`) that exercises it — long-running
    servers, `make test`, the Inspector — and that test must exist; or
  - runs here, in order, through bash, and must exit with the status the doc promises (0 unless
    the line says `# … exit status N`).
A command that is neither fails the check, and so does an `ELSEWHERE` entry no doc uses.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.snippets import REPO, Block, Command, all_commands, blocks, commands, doc_files

EXAMPLES = "tests/docs/test_examples.py"

#: Commands run by something other than this check: exact text, or `re:` + a regex (matched at
#: the start). The value is `path::test_function` or a script that contains the command.
ELSEWHERE: dict[str, str] = {
    "make test": ".ci/run",
    "make run": f"{EXAMPLES}::test_make_run_serves_the_payments_tools_and_prints_how_to_connect",
    r"re:npx -y @modelcontextprotocol/inspector@[\w.]+ --cli ": (
        f"{EXAMPLES}::test_every_inspector_command_in_the_docs_runs_against_a_real_server"
    ),
    r're:\.venv/bin/python -c "from mcp_durable\.demo\.ledger import PaymentProvider': (
        f"{EXAMPLES}::test_every_inspector_command_in_the_docs_runs_against_a_real_server"
    ),
    r"re:\.venv/bin/python examples/client\.py http ": (
        f"{EXAMPLES}::test_the_python_client_over_http_refunds_once_and_shows_the_replay"
    ),
    # Servers run until stopped: each form is started by a test that then calls it.
    "mcp-durable serve tools/payments.py": (f"{EXAMPLES}::test_the_desktop_client_config_starts_a_server_that_replays"),
    "mcp-durable serve tools/payments.py --transport http --port 8000": (
        f"{EXAMPLES}::test_make_run_serves_the_payments_tools_and_prints_how_to_connect"
    ),
    r"re:mcp-durable serve tools/payments\.py --transport http --host 127\.0\.0\.1 --port 8000 --journal sqlite:///": (
        f"{EXAMPLES}::test_the_python_client_over_http_refunds_once_and_shows_the_replay"
    ),
    # Replicas on Postgres: the replica tests serve this same form (--journal postgresql://…?schema=…).
    r"re:mcp-durable serve tools/payments\.py --transport http --host 0\.0\.0\.0 --port 8000": (
        "tests/crash/test_replicas_concurrency.py::"
        "test_five_hundred_calls_over_three_replicas_run_each_of_fifty_keys_exactly_once"
    ),
    "examples/replicas.sh --demo": f"{EXAMPLES}::test_the_replicas_script_demo_refunds_once_through_three_replicas",
    # The long run of the interleaving model test takes many minutes; CI runs it with its default examples.
    r"re:MCP_DURABLE_PROPERTY_EXAMPLES=\d+ \.venv/bin/python -m pytest tests/hardening/test_engine_interleavings\.py": (
        "tests/hardening/test_engine_interleavings.py::"
        "test_engines_sharing_a_journal_keep_every_invariant_through_stalls_crashes_cancels_and_operators"
    ),
    # The full crash runs take an hour; CI runs the same tests with the default trial count.
    r"re:MCP_DURABLE_TRIALS=200 \.venv/bin/python -m pytest tests/crash/test_danger_window\.py -s": (
        "tests/crash/test_danger_window.py::"
        "test_a_tool_whose_downstream_honours_the_key_never_duplicates_or_loses_a_result_under_retry"
    ),
    # The power-loss long run (1,000 cut points per journal) takes minutes; CI runs its short run.
    "make powerloss": (
        "tests/powerloss/test_powerloss.py::test_short_run_loses_no_acknowledged_result_and_no_durable_claim"
    ),
    # 200 SIGKILLed writers take minutes; CI runs the same test with its default 12 trials.
    r"re:MCP_DURABLE_TRIALS=200 \.venv/bin/python -m pytest tests/crash/test_file_kill_during_append\.py -s": (
        "tests/crash/test_file_kill_during_append.py::"
        "test_every_acknowledged_entry_survives_sigkill_and_the_next_append_is_never_lost"
    ),
    # 100 killed workers: the example's test runs the same runner with fewer trials.
    r"re:\.venv/bin/python examples/refund_worker\.py trials ": (
        "tests/examples/test_refund_worker.py::"
        "test_every_killed_worker_resumes_and_duplicates_happen_exactly_in_the_danger_window_without_a_key"
    ),
    # The nightly property run: CI runs the same test with 200 examples per backend.
    r"re:MCP_DURABLE_PROPERTY_EXAMPLES=\d+ \.venv/bin/python -m pytest tests/hardening/test_engine_model\.py": (
        "tests/hardening/test_engine_model.py::"
        "test_the_engine_runs_each_identity_once_per_retention_and_replays_byte_identical"
    ),
    # The operator console, mounted by `serve` and on its own: its browser tests start both forms.
    r"re:MCP_DURABLE_TOKENS=\S+ MCP_DURABLE_ADMINS=\S+ mcp-durable serve tools/payments\.py --transport http ": (
        "tests/console/test_console_pages.py::"
        "test_the_overview_shows_the_figures_of_journal_stats_read_through_an_mcp_client"
    ),
    r"re:MCP_DURABLE_TOKENS=\S+ MCP_DURABLE_ADMINS=\S+ mcp-durable console --journal ": (
        "tests/console/test_console_in_doubt.py::"
        "test_the_console_on_its_own_reads_a_file_journal_beside_its_running_server"
    ),
    "make console-screenshots": "tests/console/test_console_screenshots.py::"
    "test_the_screenshot_command_captures_the_overview_and_a_call_page",
    # SIGKILLs servers over many trials: the crash test runs the same experiment (3 trials).
    "mcp-durable demo crash --trials 3": "tests/crash/test_danger_window_demo.py::"
    "test_the_crash_demo_shows_the_plain_server_duplicating_in_the_danger_window_and_mcp_durable_never",
    # The proxy (docs/proxy.md): each command runs as written (npx offline from tests/node), used
    # by a client as the doc says.
    r"re:(MCP_DURABLE_UPSTREAM_TOKEN=\S* )?mcp-durable proxy --upstream-": (
        "tests/docs/test_proxy_examples.py::test_every_proxy_command_of_the_doc_runs_as_written"
    ),
    r"re:mcp-durable serve plain_server\.py --policies policies\.toml": (
        "tests/proxy/test_python_upstream.py::test_serve_policies_makes_the_plain_server_durable_in_process"
    ),
}

TIMEOUT = 60


def exercised_by(command: str) -> str | None:
    for pattern, where in ELSEWHERE.items():
        if pattern.startswith("re:"):
            if re.match(pattern[3:], command):
                return where
        elif command == pattern:
            return where
    return None


def defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_elsewhere_entry_names_a_test_that_exists_and_is_used_by_a_doc() -> None:
    shown = [command.text for command in all_commands()]
    for pattern, where in ELSEWHERE.items():
        path, _, name = where.partition("::")
        assert (REPO / path).is_file(), f"{pattern!r} → {where}: no such file"
        if name:
            assert name in defined_tests(REPO / path), f"{pattern!r} → {where}: no such test"
            assert name.startswith("test_")
        else:
            literal = pattern[3:] if pattern.startswith("re:") else pattern
            assert literal in (REPO / path).read_text(), f"{where} does not run {pattern!r}"
        assert any(exercised_by(text) == where and _matches(pattern, text) for text in shown), (
            f"no doc shows {pattern!r} any more: remove it from ELSEWHERE"
        )


def _matches(pattern: str, text: str) -> bool:
    return bool(re.match(pattern[3:], text)) if pattern.startswith("re:") else text == pattern


def clone_like(tmp_path: Path) -> Path:
    work = tmp_path / "clone"
    work.mkdir()
    for name in ("tools", "examples"):
        (work / name).symlink_to(REPO / name)
    (work / ".venv").symlink_to(Path(sys.prefix))
    return work


def run_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MCP_DURABLE_JOURNAL", "PAYMENTS_LEDGER")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


RUNNER = """
import runpy, sys, traceback
for path in sys.argv[1:]:
    try:
        runpy.run_path(path, run_name="__main__")
    except BaseException:
        print(f"FAILED {path}", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""


def run_python(group: list[Block], work: Path, first_index: int) -> None:
    """Run consecutive python blocks, each as `__main__` in a fresh namespace, in one interpreter
    (one import of mcp instead of one per block: the docs check stays quick)."""
    names = []
    for offset, block in enumerate(group):
        script = work / f"snippet_{first_index + offset}.py"
        script.write_text(block.text)
        names.append(script.name)
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, *names], cwd=work, env=run_env(), capture_output=True, text=True, timeout=TIMEOUT
    )
    if proc.returncode != 0:
        failed = next((b for b, n in zip(group, names, strict=True) if f"FAILED {n}" in proc.stderr), group[0])
        pytest.fail(f"{failed.where}: the python block failed\n{proc.stdout}\n{proc.stderr}")


HOW_TO_FIX = (
    "A command in the docs must run here (quickly, in a fresh directory), or be listed in ELSEWHERE "
    "in tests/docs/test_snippets.py with the test that runs it."
)


def run_command(command: Command, work: Path, env: dict[str, str]) -> None:
    try:
        proc = subprocess.run(
            ["bash", "-c", command.text],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{command.block.where}: `{command.text}` ran over {TIMEOUT}s. {HOW_TO_FIX}")
    assert proc.returncode == command.expect, (
        f"{command.block.where}: `{command.text}` exited {proc.returncode}, the doc says {command.expect}. "
        f"{HOW_TO_FIX}\n{proc.stdout}\n{proc.stderr}"
    )


@pytest.mark.parametrize("doc", doc_files(), ids=lambda path: str(path.relative_to(REPO)))
def test_every_block_in_the_doc_runs_or_is_run_by_a_named_test(doc: Path, tmp_path: Path) -> None:
    work = clone_like(tmp_path)
    env = run_env()
    group: list[Block] = []
    for index, block in enumerate([*blocks(doc), None]):
        if block is not None and block.lang == "python":
            group.append(block)
            continue
        if group:
            run_python(group, work, index - len(group))
            group = []
        if block is None:
            break
        for command in commands(block):
            if exercised_by(command.text) is None:
                run_command(command, work, env)
