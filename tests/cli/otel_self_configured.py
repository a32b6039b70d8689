"""A served module that sets OpenTelemetry up itself, at import, as an application may: its own
tracer provider (resource `service.name` `self-configured`), spans printed to stdout as they end.

    mcp-durable serve tests/cli/otel_self_configured.py --transport http

tests/cli/test_otel_environment.py serves it with `OTEL_TRACES_EXPORTER` set too: the command
line then leaves these providers alone. The server is tests/server/servers/counting.py's
(`$COUNTER_FILE`).
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from tests.server.servers.counting import make_server

SERVICE = "self-configured"

provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
trace.set_tracer_provider(provider)

server = make_server()
