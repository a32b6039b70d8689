"""Telemetry by default: servers built without `telemetry=` report through the global providers.

Each test runs tests/server/otel_global.py in a process of its own (OpenTelemetry's global
providers can be set once per process), with the SDK's in-memory exporter and reader, and
reads its JSON report.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers import REPO


def run_app(scenario: str, tmp_path: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}  # set up in code only
    proc = subprocess.run(
        [sys.executable, "-m", "tests.server.otel_global", scenario, str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,  # a bound on a hang
    )
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return report


def calls_of(report: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [s for s in report["spans"] if s["name"] == name and s["kind"] == "SERVER"]


def children(report: dict[str, Any], parent: dict[str, Any]) -> list[str]:
    return [s["name"] for s in report["spans"] if s["parent"] == parent["id"]]


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def test_the_sdk_tools_call_spans_carry_the_durable_attributes_and_the_metrics_count_without_configuration(
    tmp_path: Path,
) -> None:
    report = run_app("configured", tmp_path)
    assert report["errors"] == [False, False, True, True, False, False]  # key_reuse, in_doubt refused
    ran, replayed, reused, observed_b, unobserved = calls_of(report, "tools/call refund")
    # Server `a`, built before OpenTelemetry was set up, over streamable HTTP (2025-11-25).
    assert ran["attributes"] == {
        "mcp_durable.tool": "refund",
        "mcp_durable.principal": "local",
        "mcp_durable.outcome": "ran",
        "mcp_durable.attempt": 1,
        "mcp_durable.state": "completed",
        "mcp_durable.key_hash": key_hash("O-1"),
    }
    assert children(report, ran) == ["durable.claim", "durable.step", "durable.step", "durable.persist"]
    assert ran["parent"] is not None  # the client's span, from the trace context in `_meta`
    assert replayed["attributes"]["mcp_durable.outcome"] == "replayed"
    assert (reused["attributes"]["mcp_durable.outcome"], reused["attributes"]["mcp_durable.error_code"]) == (
        "refused",
        "key_reuse",
    )
    [doubted] = calls_of(report, "tools/call ship")
    assert doubted["attributes"]["mcp_durable.state"] == "in_doubt"
    # Server `b`, built after, in memory (2026-07-28); `off` (telemetry=False) adds nothing.
    assert observed_b["attributes"]["mcp_durable.key_hash"] == key_hash("O-5")
    assert observed_b["attributes"]["mcp_durable.outcome"] == "ran"
    assert unobserved["attributes"] == {} and children(report, unobserved) == []
    assert report["calls"] == [
        ["refund", "ran", None, 2],  # O-1 on `a`, O-5 on `b`; not O-6 on `off`
        ["refund", "refused", "key_reuse", 1],
        ["refund", "replayed", None, 1],
        ["ship", "in_doubt", "in_doubt", 1],
    ]
    # One gauge for the process: the call in doubt on each server's journal.
    assert report["in_doubt"] == [2]
    assert report["commits"] >= 4  # `a`'s SQLite and `b`'s file journal commits, measured
    assert report["warnings"] == []  # no instrument made twice


def test_a_server_called_before_opentelemetry_is_set_up_works_and_reports_once_it_is(tmp_path: Path) -> None:
    report = run_app("late", tmp_path)
    assert report["observed"] is True  # telemetry on by default
    assert report["before"] == {"order_id": "O-1", "steps": ["r-O-1", 1]}  # no-op providers: nothing breaks
    assert report["errors"] == [False, False, False]
    ran, replayed = calls_of(report, "tools/call refund")
    assert (ran["attributes"]["mcp_durable.outcome"], ran["attributes"]["mcp_durable.key_hash"]) == (
        "ran",
        key_hash("O-2"),
    )
    assert (replayed["attributes"]["mcp_durable.outcome"], replayed["attributes"]["mcp_durable.key_hash"]) == (
        "replayed",
        key_hash("O-1"),
    )
    assert report["calls"] == [["refund", "ran", None, 1], ["refund", "replayed", None, 1]]
    assert report["warnings"] == []
