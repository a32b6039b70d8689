"""What the console's pages show, read from a journal and scoped by principal.

Every function takes `principal`: None for an admin (every record), else the one principal whose
records may be shown. Counts are `journal://stats`'s own (`stats_body`), the in-doubt list is
`journal://in-doubt`'s (`in_doubt_records`), and every record, step and result goes through
`redact.py` before it is shown.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..journal.base import CallCursor, CallQuery, CountQuery, Journal
from ..journal.model import CallIdentity, CallRecord, CallState
from ..server.redact import iso, record_view, steps_view
from ..server.resources import in_doubt_records, stats_body
from ..steps import load_steps

#: Records the call list reads at most for one page (a narrow key prefix over a huge journal
#: shows a short page with a link to go on, rather than reading everything).
MAX_SCAN = 20_000
_BATCH = 500
Sensitive = Callable[[str], Awaitable[tuple[str, ...]]]


def parse_time(text: str | None) -> float | None:
    """`2026-12-01T15:04` (UTC unless an offset is given) as epoch seconds; None for empty."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not a time: {text!r} (use 2026-12-01T15:04, UTC)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


async def overview(journal: Journal, principal: str | None, now: float) -> dict[str, Any]:
    """Counts by state and tool, calls per minute over the last hour, the oldest call in doubt.

    The chart is the journal's count of the records created since an hour ago, per minute
    (`Journal.count_calls`); a record dated after `now` (another host's clock) counts in the
    last minute."""
    counts = await stats_body(journal, principal)
    start = now - 3600
    per_minute = [0] * 60
    hour = await journal.count_calls(CountQuery(principal=principal, since=start, bucket_s=60))
    for minute, n in hour.by_bucket.items():
        per_minute[min(59, minute)] += n
    doubtful = await in_doubt_records(journal, principal, now)
    oldest = min(doubtful, key=lambda r: r.created_at) if doubtful else None
    return {"counts": counts, "per_minute": per_minute, "in_doubt": len(doubtful), "oldest_in_doubt": oldest}


def chart(per_minute: list[int], width: int = 600, height: int = 90) -> dict[str, Any]:
    """Bars of an inline SVG chart (one per minute, oldest left) and the tallest bar's value."""
    top = max(per_minute) or 1
    step = width / len(per_minute)
    bars = []
    for i, n in enumerate(per_minute):
        h = round(n / top * (height - 10), 1)
        bars.append(
            {
                "x": round(i * step, 1),
                "y": round(height - h, 1),
                "w": round(step - 1, 1),
                "h": h,
                "n": n,
                "ago": len(per_minute) - i,
            }
        )
    return {"bars": bars, "top": max(per_minute), "width": width, "height": height}


@dataclass(frozen=True, slots=True)
class CallFilter:
    """The call list's filters. `until` is exclusive, `since` inclusive (epoch seconds)."""

    tool: str | None = None
    state: CallState | None = None
    principal: str | None = None
    since: float | None = None
    until: float | None = None
    key_prefix: str = ""
    limit: int = 50


async def call_page(
    journal: Journal, scope: str | None, wanted: CallFilter, cursor: CallCursor | None
) -> tuple[list[CallRecord], CallCursor | None]:
    """One page of the call list, newest first, and the cursor of the next (None: the last page).

    `scope` (a non-admin's principal) overrides `wanted.principal`. Tool, state and principal are
    filtered by the journal; time and key prefix here, reading at most `MAX_SCAN` records.
    """
    principal = scope if scope is not None else (wanted.principal or None)
    if cursor is None and wanted.until is not None:
        cursor = CallCursor(wanted.until, CallIdentity("", "", ""))  # strictly before `until`
    found: list[CallRecord] = []
    read = 0
    while True:
        batch = await journal.list_calls(
            CallQuery(principal=principal, tool=wanted.tool, state=wanted.state, limit=_BATCH, cursor=cursor)
        )
        for record in batch:
            read += 1
            if wanted.since is not None and record.created_at < wanted.since:
                return found[: wanted.limit], None
            if record.identity.key.startswith(wanted.key_prefix):
                found.append(record)
                if len(found) > wanted.limit:  # one more than shown: a next page exists
                    return found[: wanted.limit], CallCursor.after(found[wanted.limit - 1])
            cursor = CallCursor.after(record)
        if len(batch) < _BATCH:
            return found, None
        if read >= MAX_SCAN:  # a short page; the next one goes on from where this read stopped
            return found, cursor


async def call_detail(journal: Journal, identity: CallIdentity, sensitive: tuple[str, ...]) -> dict[str, Any] | None:
    """One call: its record view (masked), its durable steps, its timeline and operator actions
    (the journal's audit entries of this call, found through its index)."""
    record = await journal.get(identity)
    if record is None:
        return None
    view = record_view(record, sensitive)
    steps = steps_view(record, await load_steps(journal, record.run_id), sensitive)
    actions = [{"at": iso(e.ts), **e.data} for e in await journal.audit_entries(identity)]
    timeline = [("created (claimed)", record.created_at)]
    timeline += [(f"step {s['index']} {s['name']}", _ts(s["at"])) for s in steps]
    timeline += [(f"operator: {a['action']} by {a['by']}", _ts(a["at"])) for a in actions]
    if record.completed_at is not None:
        timeline.append((record.state.value if record.state.is_final else "completed", record.completed_at))
    timeline.append((f"last change: {record.state.value}", record.updated_at))
    if record.expires_at is not None:
        timeline.append(("expires", record.expires_at))
    timeline.sort(key=lambda item: item[1])
    return {
        "record": record,
        "view": view,
        "steps": steps,
        "actions": actions,
        "timeline": [{"what": what, "at": iso(at)} for what, at in timeline],
        "undecided": record.state in (CallState.IN_DOUBT, CallState.RELEASED, CallState.PENDING),
    }


def _ts(text: str | None) -> float:
    return parse_time(text) or 0.0


async def in_doubt(journal: Journal, principal: str | None, now: float) -> list[CallRecord]:
    """The calls of `journal://in-doubt` (in doubt, or pending with their owner gone), oldest first."""
    return sorted(await in_doubt_records(journal, principal, now), key=lambda r: r.created_at)
