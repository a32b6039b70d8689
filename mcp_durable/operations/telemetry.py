"""OpenTelemetry for durable calls: attributes on the call's span, child spans, metrics.

Opt in per server: `DurableServer(..., telemetry=Telemetry())` (or `telemetry=True`). Without
it nothing here runs. Spans and metrics go to the tracer and meter providers given, else the
global ones (which are no-ops until the application installs the OpenTelemetry SDK), so the
exporters are the application's choice (docs/telemetry.md).

The MCP SDK wraps each `tools/call` in a SERVER span (`tools/call NAME`); a durable call adds
to that span (or to a span of its own, `durable call NAME`, when none is recording):

| attribute | value |
|---|---|
| `mcp_durable.tool`, `mcp_durable.principal` | the call's tool and principal |
| `mcp_durable.outcome` | `ran`, `replayed`, `waited` (latched on to a duplicate in flight and got |
| | its result), `in_doubt`, `refused`, `error` (the tool raised; the claim was released) |
| `mcp_durable.error_code` | the refusal's code (`key_reuse`, `in_progress`, `in_doubt`, …) |
| `mcp_durable.attempt`, `mcp_durable.state` | the attempt number; the record's state after the call |
| `mcp_durable.key_hash` | SHA-256 of the key (hex, 16 bytes), HMAC-SHA-256 under `key_hash_secret` |
| | if given; `mcp_durable.key` instead with `record_keys=True` |
| `mcp_durable.reconciled`, `mcp_durable.waited` | set when true |

Child spans: `durable.claim` (a claim or a take-over), `durable.step` (each durable step,
`step`, `index`, `replayed`), `durable.persist` (`state`). Metrics (meter `mcp-durable`):
`mcp_durable.calls` (counter by tool, outcome, error_code), `mcp_durable.calls.in_doubt`
(gauge: the records in doubt this instance knows of — loaded at start, then followed through
its record changes), `mcp_durable.lease.renewals_failed` (counter),
`mcp_durable.journal.commit.duration` (histogram, s) and `mcp_durable.journal.commit.batch_size`
(histogram, writes per durable commit).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

from .. import observe
from ..errors import ConfigError, DurableError, InDoubtError
from ..journal.base import CallCursor, CallQuery, Journal
from ..journal.model import CallIdentity, CallRecord, CallState
from ..version import __version__

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
    from opentelemetry.trace import Span, TracerProvider

    from ..engine import CallOutcome, Engine

PREFIX = "mcp_durable."


class Telemetry:
    """OpenTelemetry instruments for one server (see the module docstring for what is emitted)."""

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        record_keys: bool = False,
        key_hash_secret: bytes | None = None,
    ) -> None:
        try:
            from opentelemetry import metrics, trace
        except ImportError as exc:  # pragma: no cover - the MCP SDK depends on opentelemetry-api
            raise ConfigError("telemetry needs OpenTelemetry: pip install 'mcp-durable[otel]'") from exc
        self._trace = trace
        self.tracer = trace.get_tracer("mcp-durable", __version__, tracer_provider=tracer_provider)
        meter = metrics.get_meter("mcp-durable", __version__, meter_provider=meter_provider)
        self.record_keys = record_keys
        self.key_hash_secret = key_hash_secret
        self.calls = meter.create_counter("mcp_durable.calls", unit="{call}", description="durable calls by outcome")
        self.lease_failures = meter.create_counter(
            "mcp_durable.lease.renewals_failed", unit="{renewal}", description="lease renewals that failed"
        )
        self.commit_duration = meter.create_histogram(
            "mcp_durable.journal.commit.duration", unit="s", description="time to make one journal commit durable"
        )
        self.commit_batch = meter.create_histogram(
            "mcp_durable.journal.commit.batch_size", unit="{write}", description="writes made durable by one commit"
        )
        meter.create_observable_gauge(
            "mcp_durable.calls.in_doubt",
            callbacks=[self._observe_in_doubt],
            unit="{call}",
            description="calls in doubt this instance knows of",
        )
        self.in_doubt: set[CallIdentity] = set()
        self._detach: Callable[[], None] | None = None

    # -- wiring -------------------------------------------------------------------------------------

    def attach(self, engine: Engine) -> None:
        """Follow `engine`'s record changes (for the in-doubt gauge)."""
        engine.listeners.append(self._record_changed)

    async def start(self, journal: Journal) -> None:
        """Load the calls in doubt and start observing journal commits and leases (process-wide)."""
        await self.refresh(journal)
        if self._detach is None:
            self._detach = observe.add_journal_observer(self)

    async def refresh(self, journal: Journal) -> None:
        """Re-read the calls in doubt from the journal (other replicas' changes included)."""
        found: set[CallIdentity] = set()
        cursor: CallCursor | None = None
        while page := await journal.list_calls(CallQuery(state=CallState.IN_DOUBT, limit=500, cursor=cursor)):
            found.update(r.identity for r in page)
            cursor = CallCursor.after(page[-1])
        self.in_doubt = found

    def stop(self) -> None:
        if self._detach is not None:
            self._detach()
            self._detach = None

    def _record_changed(self, record: CallRecord) -> None:
        if record.state == CallState.IN_DOUBT:
            self.in_doubt.add(record.identity)
        else:
            self.in_doubt.discard(record.identity)

    def _observe_in_doubt(self, options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        return [Observation(len(self.in_doubt))]

    # -- journal observer -----------------------------------------------------------------------

    def journal_committed(self, backend: str, seconds: float, batch: int) -> None:
        self.commit_duration.record(seconds, {"backend": backend})
        self.commit_batch.record(batch, {"backend": backend})

    def lease_renewal_failed(self, backend: str) -> None:
        self.lease_failures.add(1, {"backend": backend})

    # -- calls --------------------------------------------------------------------------------------

    @contextmanager
    def call(self, tool: str, principal: str) -> Iterator[ObservedCall]:
        """Observe one durable call: annotate the current span (or open one), bind the call's seams."""
        with ExitStack() as stack:
            span = self._trace.get_current_span()
            if not span.is_recording():  # no SDK span to add to (e.g. `call_tool` from a script)
                span = stack.enter_context(self.tracer.start_as_current_span(f"durable call {tool}"))
            observed = ObservedCall(self, span, tool, principal)
            token = observe.bind_call(observed)
            try:
                yield observed
            finally:
                observe.unbind_call(token)
                observed.close()

    def key_attribute(self, key: str) -> tuple[str, str]:
        if self.record_keys:
            return PREFIX + "key", key
        if self.key_hash_secret is not None:
            return PREFIX + "key_hash", hmac.new(self.key_hash_secret, key.encode(), hashlib.sha256).hexdigest()[:32]
        return PREFIX + "key_hash", hashlib.sha256(key.encode()).hexdigest()[:32]


class ObservedCall:
    """One durable call under observation: the `observe.CallObserver` the engine's seams reach."""

    def __init__(self, telemetry: Telemetry, span: Span, tool: str, principal: str) -> None:
        self.telemetry = telemetry
        self.call_span = span
        self.tool = tool
        self.did_wait = False
        self.outcome: str | None = None
        self.code: str | None = None
        span.set_attributes({PREFIX + "tool": tool, PREFIX + "principal": principal})

    def span(self, name: str, attributes: Mapping[str, observe.AttributeValue]) -> AbstractContextManager[Any]:
        return self.telemetry.tracer.start_as_current_span(
            name, attributes={PREFIX + k: v for k, v in attributes.items()}
        )

    def waited(self) -> None:
        self.did_wait = True

    def answered(self, outcome: CallOutcome, is_error: bool) -> None:
        """The call was answered with a result (run, replayed, reconciled, or a duplicate's)."""
        if outcome.replayed:
            self.outcome = "waited" if self.did_wait else "replayed"
        else:
            self.outcome = "ran"
        attributes: dict[str, observe.AttributeValue] = {PREFIX + "attempt": outcome.attempt}
        if outcome.key is not None:
            name, value = self.telemetry.key_attribute(outcome.key)
            attributes[name] = value
            attributes[PREFIX + "state"] = "failed" if is_error else "completed"
        if outcome.reconciled:
            attributes[PREFIX + "reconciled"] = True
        self.call_span.set_attributes(attributes)

    def refused(self, exc: DurableError) -> None:
        """The call was refused (nothing ran for it now)."""
        self.outcome = "in_doubt" if isinstance(exc, InDoubtError) else "refused"
        self.code = exc.code
        attributes: dict[str, observe.AttributeValue] = {PREFIX + "error_code": exc.code}
        key = getattr(exc, "key", None)
        if isinstance(key, str):
            name, value = self.telemetry.key_attribute(key)
            attributes[name] = value
        attempts = getattr(exc, "attempts", None)
        if isinstance(attempts, int):
            attributes[PREFIX + "attempt"] = attempts
        if isinstance(exc, InDoubtError):
            attributes[PREFIX + "state"] = CallState.IN_DOUBT.value
        self.call_span.set_attributes(attributes)

    def close(self) -> None:
        outcome = self.outcome or "error"
        self.call_span.set_attribute(PREFIX + "outcome", outcome)
        if self.did_wait:
            self.call_span.set_attribute(PREFIX + "waited", True)
        labels = {"tool": self.tool, "outcome": outcome}
        if self.code is not None:
            labels["error_code"] = self.code
        self.telemetry.calls.add(1, labels)
