"""OpenTelemetry on a FastMCP server made durable: FastMCP's `tools/call` spans carry the durable
attributes and the metrics count, as for `DurableServer` (docs/telemetry.md).

Each test runs tests/fastmcp/otel_app.py in a process of its own (OpenTelemetry's global
providers can be set once per process) with the SDK's in-memory exporter and reader, through
real clients, and reads its JSON report.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.fastmcp.servers import FastMCP  # noqa: F401 - skips (fails under CI) without FastMCP
from tests.helpers import REPO


def run_app(scenario: str, tmp_path: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}  # set up in code only
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fastmcp.otel_app", scenario, str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,  # a bound on a hang
    )
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return report


def tool_calls(report: dict[str, Any], kind: str = "SERVER") -> list[dict[str, Any]]:
    """FastMCP's `tools/call` spans (named `tools/call NAME` when the tool ran, `tools/call`
    when a middleware answered), in the order they ended."""
    return [s for s in report["spans"] if s["kind"] == kind and s["name"].split(" ")[0] == "tools/call"]


def children(report: dict[str, Any], parent: dict[str, Any]) -> list[str]:
    return [s["name"] for s in report["spans"] if s["parent"] == parent["id"]]


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def test_fastmcp_tools_call_spans_carry_the_durable_attributes_and_metrics_count_with_global_providers(
    tmp_path: Path,
) -> None:
    report = run_app("global", tmp_path)
    assert report["observed"] == [True, False]  # no `telemetry=`: on; `telemetry=False`: off
    assert report["errors"] == [False, False, True, True, True, False, False, False]
    ran, replayed, reused, unkeyed, doubted, read_only, in_memory, unobserved = tool_calls(report)
    # Over HTTP, as alice (her bearer token): the run, with its claim and persist as child spans.
    assert ran["name"] == "tools/call refund"
    assert ran["attributes"] == {
        "mcp_durable.tool": "refund",
        "mcp_durable.principal": "alice",
        "mcp_durable.outcome": "ran",
        "mcp_durable.attempt": 1,
        "mcp_durable.state": "completed",
        "mcp_durable.key_hash": key_hash("r-1"),
    }
    assert children(report, ran) == ["durable.claim", "durable.persist"]
    assert ran["parent"] is not None  # the client's span, from the trace context the client sent
    # The replay: answered by the middleware (FastMCP leaves the span named `tools/call`).
    assert replayed["attributes"] == {**ran["attributes"], "mcp_durable.outcome": "replayed"}
    assert children(report, replayed) == []  # one read of the file journal's memory: no claim, no persist
    assert reused["attributes"] == {
        "mcp_durable.tool": "refund",
        "mcp_durable.principal": "alice",
        "mcp_durable.outcome": "refused",
        "mcp_durable.error_code": "key_reuse",
        "mcp_durable.key_hash": key_hash("r-1"),
    }
    assert unkeyed["attributes"] == {
        "mcp_durable.tool": "send_mail",
        "mcp_durable.principal": "alice",
        "mcp_durable.outcome": "refused",
        "mcp_durable.error_code": "missing_key",
    }
    assert doubted["attributes"] == {
        "mcp_durable.tool": "send_mail",
        "mcp_durable.principal": "alice",
        "mcp_durable.outcome": "in_doubt",
        "mcp_durable.error_code": "in_doubt",
        "mcp_durable.state": "in_doubt",
        "mcp_durable.attempt": 1,
        "mcp_durable.key_hash": key_hash("mail-1"),
    }
    assert "r-1" not in json.dumps(report["spans"]) and "mail-1" not in json.dumps(report["spans"])
    # The read-only tool is not durable, and the server with telemetry=False adds nothing.
    assert (read_only["name"], read_only["attributes"], children(report, read_only)) == (
        "tools/call order_status",
        {},
        [],
    )
    assert in_memory["attributes"]["mcp_durable.principal"] == "local"
    assert in_memory["attributes"]["mcp_durable.outcome"] == "ran"
    assert (unobserved["name"], unobserved["attributes"], children(report, unobserved)) == (
        "tools/call refund",
        {},
        [],
    )
    assert report["calls"] == [
        ["refund", "ran", None, 2],  # r-1 over HTTP, r-2 in memory; not r-3 on the server without telemetry
        ["refund", "refused", "key_reuse", 1],
        ["refund", "replayed", None, 1],
        ["send_mail", "in_doubt", "in_doubt", 1],
        ["send_mail", "refused", "missing_key", 1],
    ]
    assert report["in_doubt"] == [1]  # the planted mail, loaded when the server started
    assert report["commits"] >= 4  # the file journal's commits: two claims, two persists


def test_explicit_providers_get_a_span_of_their_own_and_the_metrics_and_keys_in_clear_when_asked(
    tmp_path: Path,
) -> None:
    report = run_app("explicit", tmp_path)
    assert report["errors"] == [False, False, True]
    # No global provider: FastMCP's span does not record, so each call is a span of its own.
    assert tool_calls(report) == [] and tool_calls(report, "INTERNAL") == []
    ran, replayed, unkeyed = [s for s in report["spans"] if s["name"].startswith("durable call ")]
    assert (ran["name"], unkeyed["name"]) == ("durable call refund", "durable call send_mail")
    assert ran["attributes"] == {
        "mcp_durable.tool": "refund",
        "mcp_durable.principal": "local",
        "mcp_durable.outcome": "ran",
        "mcp_durable.attempt": 1,
        "mcp_durable.state": "completed",
        "mcp_durable.key": "r-1",  # record_keys=True
    }
    assert children(report, ran) == ["durable.claim", "durable.persist"]
    assert replayed["attributes"]["mcp_durable.outcome"] == "replayed"
    assert unkeyed["attributes"]["mcp_durable.error_code"] == "missing_key"
    assert report["calls"] == [
        ["refund", "ran", None, 1],
        ["refund", "replayed", None, 1],
        ["send_mail", "refused", "missing_key", 1],
    ]
