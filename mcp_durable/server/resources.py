"""The journal and the recovery state as MCP resources (docs/resources.md), scoped by principal.

| URI | what | who |
|---|---|---|
| `journal://stats` | counts by state and tool, backend, size, oldest record, retention | own records; admins all |
| `journal://recovery` | last start: snapshot, entries, time, cut bytes, in doubt | any; in doubt: own (admins all) |
| `journal://calls{?tool,state,limit,cursor}` | records newest first, `next_cursor` to page on | own; admins all |
| `journal://calls/{tool}/{key}` | one record (admins add `?principal=P` for another's) | own; admins all |
| `journal://in-doubt` | records in doubt (and pending ones whose lease ran out) | own; admins all |
| `journal://entries{?after,limit}` | the raw process-log tail | admins only |
| `journal://processes/{process_id}` | a process's state as `ReplayEngine.recover` rebuilds it | admins only |

Every resource is `application/json`. Keys are percent-encoded in URIs (RFC 6570: `a/b` is
`a%2Fb`); `uris.record_uri` gives the canonical form, which is also what change
notifications carry. A record the caller may not see, and an admin resource read by a
non-admin, answer exactly like an unknown URI (`ResourceNotFoundError`), revealing nothing.
Values a tool marks sensitive are masked in every view (`redact.py`). A read that the journal
cannot serve (locked by another writer, the database down) answers a JSON-RPC error whose
message is the same `journal_unavailable: …` a tool call gets, with the refusal object
(`{error, message}`) as its `data`.
"""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import orjson
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.server.mcpserver.resources.templates import ResourceSecurity
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, ReadResourceRequestParams

from ..journal.base import CallCursor, CallQuery, CountQuery, Journal, RecoveryReport
from ..journal.model import CallIdentity, CallRecord, CallState
from ..journal.processes import ReplayEngine
from ..journal.transfer import iter_calls
from ..policy import DEFAULT_RETENTION
from ..uris import (
    CALL_OF_PRINCIPAL_TEMPLATE,
    CALL_TEMPLATE,
    CALLS_TEMPLATE,
    ENTRIES_TEMPLATE,
    ENTRIES_URI,
    IN_DOUBT_URI,
    PROCESS_TEMPLATE,
    RECOVERY_URI,
    STATS_URI,
    process_uri,
    record_uri,
)
from .ports import DurableHost
from .redact import SensitiveNames, iso, record_summary, record_view
from .results import refusals_as_jsonrpc

if TYPE_CHECKING:
    from ..engine import Engine
    from ..operations.recovery import BackgroundRecovery
    from ..operations.retention import BackgroundRetention

JSON = "application/json"
DEFAULT_LIMIT = 50
MAX_LIMIT = 500
MAX_IN_DOUBT = 1000

#: The request being served by `resources/read` (static resources get no `Context` from the SDK,
#: but the principal may depend on the request): set by the read wrapper installed below.
_READING: ContextVar[tuple[ServerRequestContext[Any, Any] | None, str]] = ContextVar("journal_read", default=(None, ""))

# Keys, tools and process ids are data, not paths: `..` or a leading `/` are legitimate in them.
_DATA_PARAMS = ResourceSecurity(exempt_params=frozenset({"tool", "key", "principal", "process_id", "cursor"}))


def encode_cursor(cursor: CallCursor) -> str:
    """An opaque, URI-safe page token for a `CallCursor` (base64url of JSON, no padding)."""
    i = cursor.identity
    raw = orjson.dumps([cursor.created_at, i.principal, i.tool, i.key])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(token: str) -> CallCursor:
    """The `CallCursor` of a page token; raises `MCPError(INVALID_PARAMS)` for anything else."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        created_at, principal, tool, key = orjson.loads(raw)
        if not all(isinstance(s, str) for s in (principal, tool, key)) or isinstance(created_at, bool):
            raise ValueError(token)
        return CallCursor(float(created_at), CallIdentity(principal, tool, key))
    except (ValueError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise MCPError(INVALID_PARAMS, f"invalid cursor {token!r}: pass next_cursor back unchanged") from None


def _int_param(name: str, value: str | None, default: int, low: int, high: int) -> int:
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise MCPError(INVALID_PARAMS, f"{name} must be an integer, not {value!r}") from None
    if not low <= number <= high:
        raise MCPError(INVALID_PARAMS, f"{name} must be between {low} and {high}, not {number}")
    return number


def _state_param(value: str | None) -> CallState | None:
    if value is None or value == "":
        return None
    try:
        return CallState(value)
    except ValueError:
        states = ", ".join(s.value for s in CallState)
        raise MCPError(INVALID_PARAMS, f"state must be one of {states}, not {value!r}") from None


_Read = TypeVar("_Read", bound=Callable[..., Awaitable[str]])


def answering_durable_errors(read: _Read) -> _Read:
    """`read` with a `DurableError` (e.g. the journal unavailable) answered as a clear JSON-RPC error.

    Left alone, the SDK answers any exception of a resource function with "-32603 Error reading
    resource" and keeps the cause in the server's log. Here it is `results.refusal_error`: the
    code of the refusal's row in `wire_errors.WIRE`, the message a refused tool call shows
    (`journal_unavailable: …`), and `data` the same refusal object, after the resource's `uri`.
    """

    @functools.wraps(read)
    async def answered(*args: Any, **kwargs: Any) -> str:
        reading = _READING.get()[1]
        with refusals_as_jsonrpc(**({"uri": reading} if reading else {})):
            return await read(*args, **kwargs)

    return answered  # type: ignore[return-value]


def _dumps(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


async def stats_body(journal: Journal, principal: str | None) -> dict[str, Any]:
    """The counts of `journal://stats` (without retention): journal-wide for `principal=None`
    (an admin), else counted over that principal's own records. The console shows the same.

    Both are the journal's kept counts (`Journal.stats`, `Journal.count_calls`): no record is
    read, whatever the journal holds."""
    if principal is None:
        stats = await journal.stats()
        return {
            "scope": "all",
            "backend": stats.backend,
            "calls": sum(stats.calls_by_state.values()),
            "calls_by_state": stats.calls_by_state,
            "calls_by_tool": stats.calls_by_tool,
            "entries": stats.entries,
            "size_bytes": stats.size_bytes,
            "oldest_record_at": iso(stats.oldest_record_at),
        }
    # Journal-wide counts would show other principals' activity: this one's records only.
    counts = await journal.count_calls(CountQuery(principal=principal))
    return {
        "scope": "principal",
        "principal": principal,
        "backend": journal.recovery.backend if journal.recovery else None,
        "calls": counts.total,
        "calls_by_state": counts.by_state,
        "calls_by_tool": counts.by_tool,
        "oldest_record_at": iso(counts.oldest_created_at),
    }


def maintenance_body(retention: BackgroundRetention | None, recovery: BackgroundRecovery | None) -> dict[str, Any]:
    """What the server's background work did: retention (what it reclaimed, when) and recovery
    (None: that work is off)."""
    return {
        "retention": None
        if retention is None
        else {
            "interval_s": retention.schedule.interval,
            "compact_garbage_ratio": retention.schedule.compact_garbage_ratio,
            **retention.report.as_dict(),
            "last_at": iso(retention.report.last.at) if retention.report.last else None,
        },
        "recovery": None
        if recovery is None
        else {
            "interval_s": recovery.interval,
            "last": recovery.last.as_dict() if recovery.last is not None else None,
        },
    }


async def in_doubt_records(journal: Journal, principal: str | None, now: float) -> list[CallRecord]:
    """The calls of `journal://in-doubt`: IN_DOUBT records, then PENDING ones whose lease ran out
    (owner gone), of `principal` (None: everyone's); at most `MAX_IN_DOUBT + 1` (one more tells
    the list was cut)."""
    found: list[CallRecord] = []
    async for record in iter_calls(journal, principal=principal, state=CallState.IN_DOUBT):
        found.append(record)
        if len(found) > MAX_IN_DOUBT:
            return found
    async for record in iter_calls(journal, principal=principal, state=CallState.PENDING):
        if len(found) > MAX_IN_DOUBT:
            break
        if record.lease_until is None or record.lease_until <= now:
            found.append(record)
    return found


def recovery_body(report: RecoveryReport | None, engine: Engine | None, scope: str | None = None) -> dict[str, Any]:
    """What `journal://recovery` shows: the journal's open (`report`) and, with the engine that
    started on it, the calls it found in doubt and the lifecycle the previous boot left.

    `scope` is the principal whose in-doubt calls are counted (None: every principal's, for admins).
    """
    body: dict[str, Any] = {
        "scope": "all" if scope is None else "principal",
        "backend": report.backend if report else None,
        "snapshot_used": report.snapshot_used if report else None,
        "records_loaded": report.records_loaded if report else 0,
        "entries_replayed": report.entries_replayed if report else 0,
        "journal_open_s": report.duration_s if report else None,
        "bytes_truncated": report.bytes_truncated if report else 0,
        "truncated_to": report.truncated_to if report else None,
        "problems": list(report.problems) if report else [],
    }
    if engine is not None:
        body.update(
            {
                "calls_found_in_doubt": (
                    engine.orphans_found if scope is None else engine.orphans_by_principal.get(scope, 0)
                ),
                "previous_lifecycle_state": engine.previous_lifecycle_state,
                "clean_previous_stop": engine.previous_lifecycle_state in (None, "stopped"),
                "started_at": iso(engine.started_at),
                "start_duration_s": engine.start_duration_s,
                "instance_id": engine.instance_id,
                "process_id": engine.process_id,
            }
        )
    return body


class JournalResources:
    """The resource functions of one server (`host`); every read is scoped by principal.

    `maintenance` gives what the server's background work did, shown to admins in
    `journal://stats` (see `maintenance_body`).
    """

    def __init__(self, host: DurableHost, maintenance: Callable[[], dict[str, Any]]) -> None:
        self.host = host
        self._maintenance = maintenance
        self._journaled_sensitive: dict[str, tuple[str, ...]] | None = None

    # -- who is asking ------------------------------------------------------------------------------

    def principal(self) -> str:
        request, _ = _READING.get()
        return self.host.request_principal(request)

    def is_admin(self, principal: str) -> bool:
        return self.host.is_admin(principal)

    def not_found(self, uri: str) -> ResourceNotFoundError:
        # Word for word what the SDK answers for a URI nothing serves: a refusal reveals nothing.
        # The URI as the client sent it when read over MCP; else (a direct `read_resource`) ours.
        return ResourceNotFoundError(f"Unknown resource: {_READING.get()[1] or uri}")

    async def sensitive(self, tool: str) -> tuple[str, ...]:
        policy = self.host.policies.get(tool)
        if policy is not None:
            return policy.sensitive
        if self._journaled_sensitive is None:  # another server's tool sharing this journal
            self._journaled_sensitive = await SensitiveNames.load(self.host.engine.journal)
        return self._journaled_sensitive.get(tool, ())

    async def _ready(self) -> None:
        await self.host.engine.start()

    # -- resources ----------------------------------------------------------------------------------

    async def stats(self) -> str:
        """Counts of calls by state and by tool, the backend, its size, the oldest record, retention."""
        await self._ready()
        principal = self.principal()
        journal = self.host.engine.journal
        retention = {
            "default_s": DEFAULT_RETENTION,
            "by_tool": {tool: policy.retention for tool, policy in sorted(self.host.policies.items())},
        }
        admin = self.is_admin(principal)
        body = await stats_body(journal, None if admin else principal)
        body["retention"] = retention
        if admin:  # journal-wide work: counts over every principal's records
            body["maintenance"] = self._maintenance()
        return _dumps(body)

    async def recovery(self) -> str:
        """What the last start found and did: journal recovery, calls found in doubt, lifecycle."""
        await self._ready()
        principal = self.principal()
        # The journal-wide in-doubt count would show other principals' activity: each sees its own.
        scope = None if self.is_admin(principal) else principal
        return _dumps(recovery_body(self.host.engine.journal.recovery, self.host.engine, scope))

    async def calls(
        self, tool: str | None = None, state: str | None = None, limit: str | None = None, cursor: str | None = None
    ) -> str:
        """Call records newest first; pass `next_cursor` back as `cursor` for the next page."""
        await self._ready()
        principal = self.principal()
        size = _int_param("limit", limit, DEFAULT_LIMIT, 1, MAX_LIMIT)
        after = decode_cursor(cursor) if cursor else None
        scope = None if self.is_admin(principal) else principal
        # One more than asked: whether a next page exists, without ever serving an empty one.
        records = await self.host.engine.journal.list_calls(
            CallQuery(principal=scope, tool=tool or None, state=_state_param(state), limit=size + 1, cursor=after)
        )
        page, more = records[:size], len(records) > size
        return _dumps(
            {
                "calls": [record_summary(r, self.host.policies) for r in page],
                "next_cursor": encode_cursor(CallCursor.after(page[-1])) if more else None,
            }
        )

    async def call(self, tool: str, key: str, principal: str | None = None) -> str:
        """One call record: state, fingerprint, attempts, owner, lease, times, arguments, result, error."""
        await self._ready()
        caller = self.principal()
        owner = caller
        if principal and principal != caller:
            if not self.is_admin(caller):
                raise self.not_found(record_uri(tool, key))
            owner = principal
        record = await self.host.engine.journal.get(CallIdentity(owner, tool, key))
        if record is None:
            raise self.not_found(record_uri(tool, key))
        return _dumps(record_view(record, await self.sensitive(tool), self.host.policies))

    async def call_of_principal(self, tool: str, key: str, principal: str | None = None) -> str:
        """Another principal's record, for admins: `journal://calls/{tool}/{key}?principal=P`."""
        return await self.call(tool, key, principal)

    async def in_doubt(self) -> str:
        """Calls whose outcome is unknown: in doubt, or pending with an expired lease (owner gone)."""
        await self._ready()
        principal = self.principal()
        scope = None if self.is_admin(principal) else principal
        found = await in_doubt_records(self.host.engine.journal, scope, self.host.engine.clock())
        shown = found[:MAX_IN_DOUBT]
        calls = []
        for record in shown:
            view = record_summary(record, self.host.policies)
            view.update({"error": record.error, "lease_expired": record.state == CallState.PENDING})
            calls.append(view)
        return _dumps({"count": len(shown), "truncated": len(found) > MAX_IN_DOUBT, "calls": calls})

    async def entries(self, after: str | None = None, limit: str | None = None) -> str:
        """The raw process-log tail after sequence number `after` (admins only)."""
        await self._ready()
        if not self.is_admin(self.principal()):
            raise self.not_found(ENTRIES_URI)
        start = _int_param("after", after, 0, 0, 2**63 - 1)
        size = _int_param("limit", limit, 100, 1, 1000)
        rows = await self.host.engine.journal.entries(after=start, limit=size)
        return _dumps(
            {
                "entries": [
                    {
                        "seq": e.seq,
                        "process_id": e.process_id,
                        "entry_type": e.entry_type,
                        "ts": iso(e.ts),
                        "data": e.data,
                    }
                    for e in rows
                ],
                "next_after": rows[-1].seq if rows else start,
            }
        )

    async def process(self, process_id: str) -> str:
        """A process's state rebuilt from its last checkpoint and the entries after it (admins only)."""
        await self._ready()
        if not self.is_admin(self.principal()):
            raise self.not_found(process_uri(process_id))
        recovered = await ReplayEngine(self.host.engine.journal).recover(process_id)
        if recovered.last_seq == 0:
            raise self.not_found(process_uri(process_id))
        return _dumps(recovered.as_dict())


def install_read_context(lowlevel: Server[Any]) -> None:
    """Wrap `resources/read` so resource functions know the request (and so the principal)."""
    entry = lowlevel.get_request_handler("resources/read")
    if entry is None:  # pragma: no cover - MCPServer always serves resources/read
        return
    inner = entry.handler

    async def read(ctx: ServerRequestContext[Any, Any], params: ReadResourceRequestParams) -> Any:
        token = _READING.set((ctx, str(params.uri)))
        try:
            return await inner(ctx, params)
        finally:
            _READING.reset(token)

    lowlevel.add_request_handler("resources/read", ReadResourceRequestParams, read)


class JournalResource(NamedTuple):
    """One journal resource, for `DurableServer` to register: `server.resource(uri, name=…,
    mime_type=JSON, description=read.__doc__, security=…)(answering_durable_errors(read))`."""

    uri: str
    name: str
    read: Callable[..., Awaitable[str]]
    security: ResourceSecurity | None = None


def journal_resources(views: JournalResources) -> tuple[JournalResource, ...]:
    """The journal resources served by `views`, each with its URI or URI template (uris.py)."""
    return (
        JournalResource(STATS_URI, "journal-stats", views.stats),
        JournalResource(RECOVERY_URI, "journal-recovery", views.recovery),
        JournalResource(IN_DOUBT_URI, "journal-in-doubt", views.in_doubt),
        JournalResource(CALLS_TEMPLATE, "journal-calls", views.calls, _DATA_PARAMS),
        JournalResource(CALL_TEMPLATE, "journal-call", _two(views.call), _DATA_PARAMS),
        JournalResource(CALL_OF_PRINCIPAL_TEMPLATE, "journal-call-of-principal", views.call_of_principal, _DATA_PARAMS),
        JournalResource(ENTRIES_TEMPLATE, "journal-entries", views.entries),
        JournalResource(PROCESS_TEMPLATE, "journal-process", views.process, _DATA_PARAMS),
    )


def _two(call: Any) -> Any:
    # The plain record template has exactly the variables tool and key.
    async def call_record(tool: str, key: str) -> str:
        return str(await call(tool, key))

    call_record.__doc__ = JournalResources.call.__doc__
    return call_record
