"""A FastMCP application with OpenTelemetry, run in a process of its own by
tests/fastmcp/test_telemetry.py (the global providers can be set once per process).

    python -m tests.fastmcp.otel_app global|explicit TMPDIR

The shop of tests/fastmcp/servers.py made durable by `make_durable`; the calls go through real
clients. The last line printed is a JSON report: the spans (name, kind, parent, the
`mcp_durable.*` attributes), the `mcp_durable.calls` counts, the in-doubt gauge while served, the
journal commits measured, and whether each answer was an error.

- `global`: the OpenTelemetry SDK set up on the global providers (in-memory exporter and reader),
  as an application or `opentelemetry-instrument` does, before the server is built without
  `telemetry=`. Over streamable HTTP with a bearer token (the MCP SDK's client, 2025-11-25): a
  refund run, replayed, refused `key_reuse`; a mail refused `missing_key`, and refused `in_doubt`
  for the key of a call left in doubt; the read-only tool. In memory (FastMCP's `Client`): one
  refund. A second server with `telemetry=False`: one refund.
- `explicit`: nothing global; `telemetry=Telemetry(tracer_provider=…, meter_provider=…,
  record_keys=True)`. In memory: a refund run and replayed, a mail refused `missing_key`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from mcp_durable.fastmcp import DurableMiddleware
from mcp_durable.journal.model import CallIdentity, CallRecord, CallState
from mcp_durable.keys import canonical_json, fingerprint
from mcp_durable.operations.telemetry import Telemetry
from tests.fastmcp.servers import TOKENS, Shop, connected, make_durable, shop_app

REFUND = {"order_id": "O-1", "amount_cents": 500}
MAIL = {"to": "ada@example.com", "subject": "Your refund", "body": "500 cents are on their way."}


def providers() -> tuple[TracerProvider, InMemorySpanExporter, MeterProvider, InMemoryMetricReader]:
    exporter = InMemorySpanExporter()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    return tracing, exporter, MeterProvider(metric_readers=[reader]), reader


async def plant_in_doubt(durable: DurableMiddleware, principal: str, key: str) -> None:
    """A `send_mail` call left in doubt under `key` (as a crash mid-call leaves it)."""
    await durable.engine.start()
    now = time.time()
    record = CallRecord(
        identity=CallIdentity(principal, "send_mail", key),
        fingerprint=fingerprint(MAIL),
        state=CallState.IN_DOUBT,
        version=1,
        run_id="dead-run",
        attempts=1,
        created_at=now,
        updated_at=now,
        arguments=canonical_json(MAIL),
    )
    assert (await durable.journal.claim(record, now))[0]


def points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    if data is None:
        return []
    return [
        p
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == name
        for p in m.data.data_points
    ]


def report(exporter: InMemorySpanExporter, reader: InMemoryMetricReader, **extra: Any) -> dict[str, Any]:
    spans = [
        {
            "name": s.name,
            "kind": s.kind.name,
            "id": s.context.span_id if s.context is not None else None,
            "parent": s.parent.span_id if s.parent is not None else None,
            "attributes": {k: v for k, v in (s.attributes or {}).items() if k.startswith("mcp_durable.")},
            "tool": (s.attributes or {}).get("fastmcp.component.key"),
        }
        for s in exporter.get_finished_spans()
    ]
    calls = [
        [p.attributes["tool"], p.attributes["outcome"], p.attributes.get("error_code"), p.value]
        for p in points(reader, "mcp_durable.calls")
    ]
    return {
        "spans": spans,
        "calls": sorted(calls, key=str),
        "commits": sum(p.count for p in points(reader, "mcp_durable.journal.commit.batch_size")),
        **extra,
    }


async def configured_globally(tmp: Path) -> dict[str, Any]:
    tracing, exporter, meters, reader = providers()
    trace.set_tracer_provider(tracing)
    metrics.set_meter_provider(meters)
    shop = Shop(tmp)
    app = shop_app(shop, tokens=TOKENS)
    durable = make_durable(app, journal=f"file://{tmp}/journal", policies=shop.policies)
    await plant_in_doubt(durable, "alice", "mail-1")
    off_shop = Shop(tmp / "off")
    off_app = shop_app(off_shop, name="off")
    off = make_durable(off_app, journal="memory://", policies=off_shop.policies, telemetry=False)
    async with (
        connected("mcp-legacy", app, token="tokA") as over_http,
        connected("fastmcp", app) as in_memory,
        connected("fastmcp", off_app) as unobserved,
    ):
        answers = [
            await over_http.call("refund", REFUND, key="r-1"),
            await over_http.call("refund", REFUND, key="r-1"),
            await over_http.call("refund", {"order_id": "O-2", "amount_cents": 1}, key="r-1"),
            await over_http.call("send_mail", MAIL),
            await over_http.call("send_mail", MAIL, key="mail-1"),
            await over_http.call("order_status", {"order_id": "O-1"}),
            await in_memory.call("refund", REFUND, key="r-2"),
            await unobserved.call("refund", REFUND, key="r-3"),
        ]
        gauge = [p.value for p in points(reader, "mcp_durable.calls.in_doubt")]  # while served
    return report(
        exporter,
        reader,
        errors=[bool(r.is_error) for r in answers],
        in_doubt=gauge,
        observed=[durable.telemetry is not None, off.telemetry is not None],
    )


async def explicit(tmp: Path) -> dict[str, Any]:
    tracing, exporter, meters, reader = providers()
    shop = Shop(tmp)
    app = shop_app(shop)
    telemetry = Telemetry(tracer_provider=tracing, meter_provider=meters, record_keys=True)
    make_durable(app, journal="memory://", policies=shop.policies, telemetry=telemetry)
    async with connected("fastmcp", app) as caller:
        answers = [
            await caller.call("refund", REFUND, key="r-1"),
            await caller.call("refund", REFUND, key="r-1"),
            await caller.call("send_mail", MAIL),
        ]
    return report(exporter, reader, errors=[bool(r.is_error) for r in answers])


def main() -> None:
    scenario, tmp = sys.argv[1], Path(sys.argv[2])
    run = {"global": configured_globally, "explicit": explicit}[scenario]
    print(json.dumps(anyio.run(run, tmp)))


if __name__ == "__main__":
    main()
