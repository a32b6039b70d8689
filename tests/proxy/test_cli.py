"""`mcp-durable proxy` from the command line: `--print-config`, serving over stdio, usage errors."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from mcp_durable.policy import ToolPolicy
from mcp_durable.policy_file import parse_policies
from tests.helpers import REPO, free_port, key_meta, serve_command
from tests.node_peers import package_bin
from tests.proxy.upstreams import EVERYTHING, MEMORY


def _proxy(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*serve_command(), "proxy", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_print_config_writes_the_policies_the_proxy_would_use_for_the_upstream(tmp_path: Path) -> None:
    memory = shlex.join(package_bin(MEMORY))
    printed = _proxy("--upstream-command", memory, "--print-config")
    assert printed.returncode == 0, printed.stderr
    policies = parse_policies(printed.stdout, "printed")
    # server-memory: delete_* are annotated idempotent (durable), create_* are not (pass-through).
    assert policies.for_tool("delete_entities", None) == ToolPolicy(in_doubt="retry")
    assert policies.for_tool("create_entities", None) is None
    assert policies.for_tool("read_graph", None) is None  # readOnlyHint
    edited = tmp_path / "policies.toml"
    edited.write_text('[tools.create_entities]\nkey = "required"\nin_doubt = "refuse"\n')
    printed = _proxy("--upstream-command", memory, "--policies", str(edited), "--print-config")
    again = parse_policies(printed.stdout)
    assert again.for_tool("create_entities", None) == ToolPolicy(key="required", in_doubt="refuse")


def test_print_config_lists_the_tools_the_upstream_lists_only_to_capable_clients() -> None:
    # server-everything lists these only to a client declaring sampling / elicitation: the
    # policies can name them, so --print-config lists through a session declaring both.
    printed = _proxy("--upstream-command", shlex.join(package_bin(EVERYTHING)), "--print-config")
    assert printed.returncode == 0, printed.stderr
    assert "trigger-sampling-request" in printed.stdout and "trigger-elicitation-request" in printed.stdout


def test_usage_errors_exit_2_and_config_errors_exit_1(tmp_path: Path) -> None:
    assert _proxy().returncode == 2  # no upstream
    assert _proxy("--upstream-command", "x", "--upstream-url", "http://127.0.0.1:1/mcp").returncode == 2
    assert _proxy("--upstream-command", "x", "--upstream-timeout", "0").returncode == 2
    bad = tmp_path / "bad.toml"
    bad.write_text("[tools.x]\nlease = -1\n")
    done = _proxy("--upstream-command", "x", "--policies", str(bad), "--print-config")
    assert done.returncode == 1 and "bad.toml:2: tools.x.lease" in done.stderr
    assert "Traceback" not in done.stderr
    done = _proxy("--upstream-command", str(tmp_path / "missing"), "--print-config", timeout=60)
    assert done.returncode == 1 and "cannot be reached" in done.stderr


@pytest.mark.parametrize("where", ["url", "command"])
def test_print_config_with_an_unreachable_upstream_says_so_in_one_line_without_a_traceback(
    tmp_path: Path, where: str
) -> None:
    upstream = (
        ["--upstream-url", f"http://127.0.0.1:{free_port()}/mcp"]
        if where == "url"
        else ["--upstream-command", str(tmp_path / "no-such-server")]
    )
    done = _proxy(*upstream, "--print-config", timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr  # before the fix: an exception group's traceback
    [line] = done.stderr.splitlines()
    assert line.startswith("mcp-durable: upstream ") and "cannot be reached" in line
    debug = subprocess.run(
        [*serve_command(), "--debug", "proxy", *upstream, "--print-config"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert debug.returncode == 1 and "Traceback" in debug.stderr  # --debug shows it


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_proxy_serves_over_stdio(tmp_path: Path, mode: str) -> None:
    command, *prefix = serve_command()
    params = StdioServerParameters(
        command=command,
        cwd=str(REPO),
        env={"MEMORY_FILE_PATH": str(tmp_path / "memory.jsonl"), "PATH": "/usr/bin:/bin"},
        args=[
            *prefix,
            "proxy",
            "--upstream-command",
            shlex.join(package_bin(MEMORY)),
            "--journal",
            f"sqlite:///{tmp_path}/proxy.db",
        ],
    )
    async with Client(params, mode=mode) as client:
        gone = await client.call_tool("delete_entities", {"entityNames": ["nobody"]}, meta=key_meta("d-1"))
        again = await client.call_tool("delete_entities", {"entityNames": ["nobody"]}, meta=key_meta("d-1"))
    assert gone.meta is not None and gone.meta["mcp-durable/key"] == "d-1"
    assert again.meta is not None and again.meta["mcp-durable/replayed"] is True
