"""OpenTelemetry for durable calls: attributes on the call's span, child spans, metrics.

On by default, as a library instruments: a face built without `telemetry=` (or with `None` or
`True`) observes its calls through the global tracer and meter providers (`face_telemetry`), so
an application that configured OpenTelemetry, or runs under `opentelemetry-instrument`, gets
what follows with nothing else to do; until it does, the API's providers are no-ops and a call
costs a few attribute reads (`ObservedCall`). `telemetry=Telemetry(tracer_provider=…,
meter_provider=…)` sends to explicit providers; `telemetry=False` turns it off
(docs/telemetry.md).

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
(gauge: the records in doubt the started servers on these providers know of — each loaded at
start, then followed through its record changes), `mcp_durable.lease.renewals_failed`
(counter), `mcp_durable.journal.commit.duration` (histogram, s) and
`mcp_durable.journal.commit.batch_size` (histogram, writes per durable commit).
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from contextvars import Token
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, ClassVar

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
#: How long a server without OpenTelemetry configured goes without asking again (`Instruments.observing`).
QUIET_RECHECK_S = 1.0
_NO_SPAN: AbstractContextManager[Any] = nullcontext()


def face_telemetry(option: Telemetry | bool | None) -> Telemetry | None:
    """The telemetry a face runs with for its `telemetry=` option (None: none).

    `False`: none. A `Telemetry`: that one. `None` (the default) and `True`: one on the global
    providers — except that `None` quietly means none where the OpenTelemetry API is not
    installed, while `True` asked for it and raises `ConfigError` there.
    """
    if option is False:
        return None
    if isinstance(option, Telemetry):
        return option
    if option is None:
        try:
            import opentelemetry.metrics  # noqa: F401
            import opentelemetry.trace  # noqa: F401
        except ImportError:  # pragma: no cover - the MCP SDK depends on opentelemetry-api
            return None
    return Telemetry()


class Instruments:
    """The tracer and the metric instruments on one pair of providers, and the servers they count.

    Every `Telemetry` made without providers shares the global pair's (`shared()`): OpenTelemetry
    expects an instrument once per meter (a second of the same name is the first, its callbacks
    dropped), and the API's stand-in meter, before the application sets a provider, keeps every
    instrument made on it — one set per process, not one per server.
    """

    _shared: ClassVar[Instruments | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, tracer_provider: TracerProvider | None, meter_provider: MeterProvider | None) -> None:
        try:
            from opentelemetry import metrics, trace
        except ImportError as exc:  # pragma: no cover - the MCP SDK depends on opentelemetry-api
            raise ConfigError("telemetry needs OpenTelemetry: pip install 'mcp-durable[otel]'") from exc
        self.trace: ModuleType = trace
        self.metrics: ModuleType = metrics
        # On the global providers these are the API's proxies until the application sets its
        # own, and follow it from then on: a server built before OpenTelemetry is set up reports.
        self.tracer = trace.get_tracer("mcp-durable", __version__, tracer_provider=tracer_provider)
        meter = metrics.get_meter("mcp-durable", __version__, meter_provider=meter_provider)
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
        #: Whether these instruments report anywhere whatever the application does: given
        #: providers, or both global ones set (a global provider, once set, stays: `observing`).
        self._reporting = tracer_provider is not None or meter_provider is not None
        #: Until when (`time.monotonic()`) `observing` answers no without asking the API.
        self._quiet_until = 0.0
        #: The started servers' telemetry. Replaced whole, never changed in place: the gauge reads
        #: it from the metric reader's thread.
        self.servers: tuple[Telemetry, ...] = ()
        self._lock = threading.Lock()
        self._detach: Callable[[], None] | None = None

    @classmethod
    def shared(cls) -> Instruments:
        """The instruments on the global providers, made at the first call."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls(None, None)
            return cls._shared

    def observing(self) -> bool:
        """Whether a call observed now could be seen by anyone: False only for the global
        providers while the application has set neither (the OpenTelemetry API's own stand-ins
        answer, and drop every span and measurement), so a server without OpenTelemetry
        configured skips the per-call work.

        Asking the API costs more than the rest of a call's telemetry (it looks up two
        environment variables each time until a provider is set), so a "no" holds for
        `QUIET_RECHECK_S`, or until `recheck` (a server built or started): providers set
        before a server starts are seen from its first call, providers set while it runs
        within that time."""
        if self._reporting:
            return True
        now = time.monotonic()
        if now < self._quiet_until:
            return False
        tracing_set = not api_stand_in(self.trace.get_tracer_provider())
        meters_set = not api_stand_in(self.metrics.get_meter_provider())
        if tracing_set or meters_set:
            # Each provider can be set once; with both set this stays true for good.
            self._reporting = tracing_set and meters_set
            return True
        self._quiet_until = now + QUIET_RECHECK_S
        return False

    def recheck(self) -> None:
        """Ask the API again at the next call (`observing`)."""
        self._quiet_until = 0.0

    def started(self, telemetry: Telemetry) -> None:
        """Count `telemetry`'s calls in doubt; observe journal commits and leases while any server runs."""
        with self._lock:
            self.servers = (*self.servers, telemetry)
            if self._detach is None:
                # Journal commits and leases are the process's: observed once per set of instruments.
                self._detach = observe.add_journal_observer(self)

    def stopped(self, telemetry: Telemetry) -> None:
        with self._lock:
            self.servers = tuple(s for s in self.servers if s is not telemetry)
            if not self.servers and self._detach is not None:
                self._detach()
                self._detach = None

    def _observe_in_doubt(self, options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        return [Observation(sum(len(t.in_doubt) for t in self.servers))]

    # -- journal observer (observe.JournalObserver) -------------------------------------------------

    def journal_committed(self, backend: str, seconds: float, batch: int) -> None:
        self.commit_duration.record(seconds, {"backend": backend})
        self.commit_batch.record(batch, {"backend": backend})

    def lease_renewal_failed(self, backend: str) -> None:
        self.lease_failures.add(1, {"backend": backend})


def api_stand_in(provider: object) -> bool:
    """Whether `provider` is one of the OpenTelemetry API's own (its no-op providers, or the
    stand-in it answers with until the application sets one): those emit nothing. An SDK's
    providers live in packages of their own (`opentelemetry.sdk`, a vendor's)."""
    return type(provider).__module__.startswith(("opentelemetry.trace", "opentelemetry.metrics"))


class Telemetry:
    """OpenTelemetry for one server (see the module docstring for what is emitted).

    Without providers it sends to the global ones (`Instruments.shared()`); a provider given
    gets instruments of its own.
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        record_keys: bool = False,
        key_hash_secret: bytes | None = None,
    ) -> None:
        if tracer_provider is None and meter_provider is None:
            self.instruments = Instruments.shared()
            self.instruments.recheck()  # providers the application set before building this server
        else:
            self.instruments = Instruments(tracer_provider, meter_provider)
        self.record_keys = record_keys
        self.key_hash_secret = key_hash_secret
        #: The calls in doubt this server knows of (the gauge's share).
        self.in_doubt: set[CallIdentity] = set()
        self._started = False

    # -- wiring -------------------------------------------------------------------------------------

    def attach(self, engine: Engine) -> None:
        """Follow `engine`'s record changes (for the in-doubt gauge)."""
        engine.listeners.append(self._record_changed)

    async def start(self, journal: Journal) -> None:
        """Load the calls in doubt; counted by the gauge, and journal commits and leases observed
        (process-wide), until `stop`."""
        await self.refresh(journal)
        self.instruments.recheck()  # providers the application set before starting this server
        if not self._started:
            self._started = True
            self.instruments.started(self)

    async def refresh(self, journal: Journal) -> None:
        """Re-read the calls in doubt from the journal (other replicas' changes included)."""
        found: set[CallIdentity] = set()
        cursor: CallCursor | None = None
        while page := await journal.list_calls(CallQuery(state=CallState.IN_DOUBT, limit=500, cursor=cursor)):
            found.update(r.identity for r in page)
            cursor = CallCursor.after(page[-1])
        self.in_doubt = found

    def stop(self) -> None:
        if self._started:
            self._started = False
            self.instruments.stopped(self)

    def _record_changed(self, record: CallRecord) -> None:
        if record.state == CallState.IN_DOUBT:
            self.in_doubt.add(record.identity)
        elif self.in_doubt:  # (an identity's hash is a Python call: not taken when none is in doubt)
            self.in_doubt.discard(record.identity)

    # -- calls --------------------------------------------------------------------------------------

    def observing(self) -> bool:
        """Whether a call observed now could be seen by anyone (`Instruments.observing`): a face
        skips `call` when not."""
        return self.instruments.observing()

    def call(self, tool: str, principal: str) -> ObservedCall:
        """Observe one durable call: `with telemetry.call(tool, principal) as observed:`."""
        return ObservedCall(self, tool, principal)

    def key_attribute(self, key: str) -> tuple[str, str]:
        if self.record_keys:
            return PREFIX + "key", key
        if self.key_hash_secret is not None:
            return PREFIX + "key_hash", hmac.new(self.key_hash_secret, key.encode(), hashlib.sha256).hexdigest()[:32]
        return PREFIX + "key_hash", hashlib.sha256(key.encode()).hexdigest()[:32]


class ObservedCall:
    """One durable call under observation: a context manager around the call, and the
    `observe.CallObserver` the engine's seams reach inside it.

    On entry it finds the call's span: the current one if it records (the MCP SDK's
    `tools/call` span), else one of its own if that records. If neither does (OpenTelemetry not
    configured, or the call not sampled) no span is touched — no attributes, no key hash, no
    child spans — and the call is only counted, on instruments that do nothing until a meter
    provider is set: the whole cost of the default for a server without OpenTelemetry.
    """

    __slots__ = ("_own", "_token", "call_span", "code", "did_wait", "outcome", "principal", "telemetry", "tool")

    def __init__(self, telemetry: Telemetry, tool: str, principal: str) -> None:
        self.telemetry = telemetry
        self.tool = tool
        self.principal = principal
        #: The span the call's attributes go to (None: none records).
        self.call_span: Span | None = None
        self.did_wait = False
        self.outcome: str | None = None
        self.code: str | None = None
        self._own: AbstractContextManager[Any] | None = None
        self._token: Token[observe.CallObserver | None] | None = None

    def __enter__(self) -> ObservedCall:
        instruments = self.telemetry.instruments
        span = instruments.trace.get_current_span()
        if not span.is_recording():  # no SDK span to add to (e.g. `call_tool` from a script)
            # Started, and made current only if it records: on the API's no-op tracer this is
            # one call returning the invalid span, with no context to attach and detach.
            span = instruments.tracer.start_span(f"durable call {self.tool}")
            if span.is_recording():
                self._own = instruments.trace.use_span(span, end_on_exit=True)
                self._own.__enter__()
        if span.is_recording():
            self.call_span = span
            span.set_attributes({PREFIX + "tool": self.tool, PREFIX + "principal": self.principal})
        self._token = observe.bind_call(self)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._token is not None:
            observe.unbind_call(self._token)
        try:
            self.close()
        finally:
            if self._own is not None:
                self._own.__exit__(exc_type, exc, tb)  # ends the span; an exception recorded on it

    def span(self, name: str, attributes: Mapping[str, observe.AttributeValue]) -> AbstractContextManager[Any]:
        # Children only of a recording call span: under the SDK's default (parent-based)
        # sampler a child of an unsampled call is dropped anyway.
        if self.call_span is None:
            return _NO_SPAN
        return self.telemetry.instruments.tracer.start_as_current_span(
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
        if self.call_span is None:
            return
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
        if self.call_span is None:
            return
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
        """The call is over: its outcome on its span, and counted."""
        outcome = self.outcome or "error"
        if self.call_span is not None:
            self.call_span.set_attribute(PREFIX + "outcome", outcome)
            if self.did_wait:
                self.call_span.set_attribute(PREFIX + "waited", True)
        labels = {"tool": self.tool, "outcome": outcome}
        if self.code is not None:
            labels["error_code"] = self.code
        self.telemetry.instruments.calls.add(1, labels)
