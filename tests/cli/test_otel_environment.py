"""`mcp-durable serve` and `proxy` set OpenTelemetry up from the standard `OTEL_*` variables
(mcp_durable/cli/otel_env.py), without `opentelemetry-instrument`.

Real subprocesses (the console script) and real MCP clients: a durable tool called twice with one
key prints the SDK's `tools/call` SERVER spans with the `mcp_durable.*` attributes (`ran`, then
`replayed`) through the console exporter, each before its call is answered — on stdout over HTTP,
on stderr over stdio (stdout is the protocol there) — and, when SIGTERM stops the HTTP server,
the `mcp_durable.calls` counts. Without the variables, or with `OTEL_SDK_DISABLED=true`, nothing is
printed; a module that set its own providers keeps them; an exporter that is not installed is
one line and the server serves. The private OpenTelemetry names the adapter uses are checked to
be still there.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from mcp_durable.cli import otel_env
from tests.helpers import REPO, ServedHttp, free_port, key_meta, serve_command, wait_listening
from tests.proxy.upstreams import PLAIN_UPSTREAM
from tests.server.servers.counting import Counter

COUNTING = "tests/server/servers/counting.py:make_server"
CONSOLE = {"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "console", "OTEL_SERVICE_NAME": "durable-cli"}
PACKAGE = REPO / "mcp_durable"


@dataclass
class Served:
    """A served command and its client; `output` once the command has exited."""

    client: Client
    transport: str
    stdout_path: Path
    stderr_path: Path
    output: Output | None = None

    def console_now(self) -> str:
        """What the console exporters wrote so far: stderr over stdio, stdout over HTTP."""
        return (self.stderr_path if self.transport == "stdio" else self.stdout_path).read_text()


@dataclass
class Output:
    """What a served command wrote, after it exited."""

    stdout: str
    stderr: str

    def console(self, transport: str) -> str:
        """Where the console exporters write: stderr over stdio, stdout over HTTP."""
        return self.stderr if transport == "stdio" else self.stdout


def _environment(extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment without any `OTEL_*` of its own, plus `extra`."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}, **extra}


@asynccontextmanager
async def _served(
    cli_args: Sequence[str], transport: str, env: Mapping[str, str], tmp_path: Path
) -> AsyncIterator[Served]:
    """`mcp-durable CLI_ARGS --transport TRANSPORT` with a connected client; once the block is
    left, the command has exited and `output` holds what it wrote."""
    out, err = tmp_path / f"{transport}.out", tmp_path / f"{transport}.err"
    out.touch()
    command = [*serve_command(), *cli_args, "--transport", transport]
    if transport == "stdio":
        params = StdioServerParameters(command=command[0], args=command[1:], env=dict(env), cwd=str(REPO))
        with err.open("w") as errlog:
            async with Client(stdio_client(params, errlog=errlog)) as client:
                served = Served(client, transport, out, err)
                yield served
        served.output = Output("", err.read_text())
        return
    port = free_port()
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
        )
    try:
        assert await wait_listening(ServedHttp(f"http://127.0.0.1:{port}/mcp", port, proc, err)), err.read_text()
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            served = Served(client, transport, out, err)
            yield served
        proc.send_signal(signal.SIGTERM)  # as `docker stop` does: uvicorn shuts down gracefully
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    served.output = Output(out.read_text(), err.read_text())


def _json_documents(text: str) -> Iterator[dict[str, Any]]:
    """The JSON objects the console exporters printed (each starts with `{` alone on a line),
    skipping the server's own lines between them."""
    decoder = json.JSONDecoder()
    position = 0
    while (start := text.find("{\n", position)) != -1:
        if start and text[start - 1] != "\n":
            position = start + 1
            continue
        document, position = decoder.raw_decode(text, start)
        if isinstance(document, dict):
            yield document


def _call_spans(text: str, tool: str) -> list[dict[str, Any]]:
    return [
        doc
        for doc in _json_documents(text)
        if doc.get("name") == f"tools/call {tool}" and doc.get("kind") == "SpanKind.SERVER"
    ]


def _durable(span: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in span["attributes"].items() if k.startswith("mcp_durable.")}


def _calls_counted(text: str) -> dict[str, int]:
    """`mcp_durable.calls` by outcome, from the metrics printed (the last export is cumulative)."""
    counted: dict[str, int] = {}
    for doc in _json_documents(text):
        for resource in doc.get("resource_metrics", ()):
            for scope in resource["scope_metrics"]:
                for metric in scope["metrics"]:
                    if metric["name"] == "mcp_durable.calls":
                        for point in metric["data"]["data_points"]:
                            counted[point["attributes"]["outcome"]] = point["value"]
    return counted


def _assert_ran_then_replayed(spans: list[dict[str, Any]], tool: str, output: Output) -> None:
    assert [_durable(s).get("mcp_durable.outcome") for s in spans] == ["ran", "replayed"], output
    first, second = (_durable(s) for s in spans)
    assert first["mcp_durable.tool"] == second["mcp_durable.tool"] == tool
    assert first["mcp_durable.key_hash"] == second["mcp_durable.key_hash"]
    assert first["mcp_durable.state"] == "completed" and first["mcp_durable.attempt"] == 1
    assert all(s["resource"]["attributes"]["service.name"] == "durable-cli" for s in spans)


async def _call_twice(client: Client, tool: str) -> None:
    for _ in range(2):
        result = await client.call_tool(tool, {"text": "hello"}, meta=key_meta("k-1"))
        assert not result.is_error, result


def _output(served: Served) -> Output:
    assert served.output is not None
    return served.output


def _serve_args(tmp_path: Path, target: str = COUNTING) -> list[str]:
    return ["serve", target, "--journal", f"sqlite:///{tmp_path}/j.db"]


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_serve_prints_the_durable_attributes_with_otel_traces_exporter_console(
    tmp_path: Path, transport: str
) -> None:
    env = _environment({**CONSOLE, "COUNTER_FILE": str(tmp_path / "counter")})
    async with _served(_serve_args(tmp_path), transport, env, tmp_path) as served:
        await _call_twice(served.client, "record")
        # Each console span is printed as it ends, before the call is answered, not in a batch.
        assert len(_call_spans(served.console_now(), "record")) == 2, served.console_now()
    output = _output(served)
    assert Counter(tmp_path / "counter").count("record") == 1
    _assert_ran_then_replayed(_call_spans(output.console(transport), "record"), "record", output)
    assert "OpenTelemetry set up from OTEL_* (traces: console; metrics: console; logs: none)" in output.stderr
    if transport == "http":
        # The metrics are exported when the server stops (SIGTERM, after which the process never
        # reaches its exit hooks). Over stdio the client gives the server a short grace period
        # to exit once its stdin closes, so they are read over HTTP only.
        assert _calls_counted(output.stdout) == {"ran": 1, "replayed": 1}, output


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_proxy_prints_the_durable_attributes_with_otel_traces_exporter_console(
    tmp_path: Path, transport: str
) -> None:
    env = _environment(
        {
            **CONSOLE,
            "COUNTER_FILE": str(tmp_path / "counter"),
            "LEDGER_DB": str(tmp_path / "ledger.db"),
            "PYTHONPATH": str(REPO),
        }
    )
    upstream = shlex.join([sys.executable, str(REPO / PLAIN_UPSTREAM)])
    args = ["proxy", "--upstream-command", upstream, "--journal", f"sqlite:///{tmp_path}/proxy.db"]
    async with _served(args, transport, env, tmp_path) as served:
        await _call_twice(served.client, "record")  # idempotentHint: durable by default
    output = _output(served)
    assert Counter(tmp_path / "counter").count("record") == 1
    _assert_ran_then_replayed(_call_spans(output.console(transport), "record"), "record", output)
    if transport == "http":
        assert _calls_counted(output.stdout) == {"ran": 1, "replayed": 1}, output


@pytest.mark.parametrize(
    "otel",
    [{}, {**CONSOLE, "OTEL_SDK_DISABLED": "true"}],
    ids=["no-variables", "sdk-disabled"],
)
async def test_without_the_variables_or_with_the_sdk_disabled_nothing_is_printed(
    tmp_path: Path, otel: dict[str, str]
) -> None:
    env = _environment({**otel, "COUNTER_FILE": str(tmp_path / "counter")})
    async with _served(_serve_args(tmp_path), "http", env, tmp_path) as served:
        await _call_twice(served.client, "record")
    output = _output(served)
    assert Counter(tmp_path / "counter").count("record") == 1
    assert output.stdout == ""
    assert "tools/call" not in output.stderr and "OpenTelemetry" not in output.stderr, output.stderr


async def test_a_module_that_set_its_own_providers_keeps_them(tmp_path: Path) -> None:
    env = _environment({**CONSOLE, "COUNTER_FILE": str(tmp_path / "counter")})
    async with _served(_serve_args(tmp_path, "tests.cli.otel_self_configured"), "http", env, tmp_path) as served:
        await _call_twice(served.client, "record")
    output = _output(served)
    spans = _call_spans(output.stdout, "record")
    # The module's provider, once each: the command line set nothing up over it (which
    # OpenTelemetry would have refused, with a warning).
    assert [_durable(s)["mcp_durable.outcome"] for s in spans] == ["ran", "replayed"], output
    assert {s["resource"]["attributes"]["service.name"] for s in spans} == {"self-configured"}
    assert "OpenTelemetry set up from OTEL_*" not in output.stderr, output.stderr
    assert "Overriding" not in output.stderr, output.stderr


async def test_an_otlp_endpoint_without_the_otlp_exporter_installed_is_one_line_and_the_server_serves(
    tmp_path: Path,
) -> None:
    if any(entry_points(group="opentelemetry_traces_exporter", name="otlp_proto_grpc")):
        pytest.skip("the OTLP exporter is installed here")  # the failure below needs it missing
    env = _environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "COUNTER_FILE": str(tmp_path / "c")})
    async with _served(_serve_args(tmp_path), "http", env, tmp_path) as served:
        await _call_twice(served.client, "record")
    output = _output(served)
    [line] = [line for line in output.stderr.splitlines() if "OpenTelemetry" in line]
    assert line.startswith("mcp-durable: OpenTelemetry not set up from OTEL_*: "), line
    assert "otlp_proto_grpc" in line and "pip install opentelemetry-exporter-otlp" in line
    assert "Traceback" not in output.stderr and output.stdout == ""


#: Sets OpenTelemetry up as `serve --transport stdio` does, then ends a span, counts and exits: what the
#: console exporters print at any time, outside the MCP SDK's stdio server too (its diversion of
#: stdout lasts only while it serves; the metrics are exported at exit, after it).
STDIO_PROBE = """
import os, sys
from opentelemetry import metrics, trace
from mcp_durable.cli.otel_env import configure_from_environment
print(configure_from_environment(dict(os.environ), stdio=True), file=sys.stderr)
with trace.get_tracer("probe").start_as_current_span("probe span"):
    metrics.get_meter("probe").create_counter("probe.count").add(1)
"""


def test_over_stdio_the_console_exporters_write_to_stderr() -> None:
    done = subprocess.run(
        [sys.executable, "-c", STDIO_PROBE],
        env=_environment(CONSOLE),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout == ""
    names = [doc.get("name") for doc in _json_documents(done.stderr)]
    assert "probe span" in names, done.stderr
    assert any("resource_metrics" in doc for doc in _json_documents(done.stderr)), done.stderr


@pytest.mark.parametrize(
    ("environ", "asked"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x", "OTEL_RESOURCE_ATTRIBUTES": "a=b"}, False),  # describe, export nothing
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_METRICS_EXPORTER": "none"}, True),
        ({"OTEL_LOGS_EXPORTER": "console"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, True),
        ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://collector:4318/v1/metrics"}, True),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "TRUE"}, False),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "false"}, True),
    ],
)
def test_which_variables_ask_for_opentelemetry(environ: dict[str, str], asked: bool) -> None:
    assert otel_env.requested(environ) is asked


def test_an_otlp_endpoint_makes_otlp_the_exporter_of_a_signal_whose_variable_is_unset() -> None:
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_EXPORTER": "console"}
    assert otel_env.configured_exporters(endpoint) == {"traces": [], "metrics": ["otlp_proto_grpc"]}
    http = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c/v1/traces", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    assert otel_env.configured_exporters(http) == {"traces": ["otlp_proto_http"], "metrics": []}


def test_the_private_opentelemetry_names_the_adapter_uses_are_still_there() -> None:
    for dotted in otel_env.INTERNALS:
        module, _, name = dotted.rpartition(".")
        assert hasattr(importlib.import_module(module), name), f"OpenTelemetry no longer has {dotted}"
    from opentelemetry.sdk._configuration import _BaseConfigurator, _initialize_components, _OTelSDKConfigurator

    assert issubclass(_OTelSDKConfigurator, _BaseConfigurator) and callable(_OTelSDKConfigurator.configure)
    taken = set(inspect.signature(_initialize_components).parameters)
    used = {"trace_exporter_names", "metric_exporter_names", "exporter_args_map", "export_span_processor"}
    assert used <= taken, f"the SDK's configuration no longer takes {sorted(used - taken)}"


def test_no_module_but_the_adapter_imports_a_private_opentelemetry_name() -> None:
    adapter = Path(otel_env.__file__).resolve()
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("opentelemetry"):
                parts = [*(node.module or "").split("."), *(alias.name for alias in node.names)]
                if any(part.startswith("_") for part in parts) and path != adapter:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == [], "private OpenTelemetry names outside mcp_durable/cli/otel_env.py: " + ", ".join(found)
