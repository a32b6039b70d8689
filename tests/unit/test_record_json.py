"""`record_json`: a record's `reason` in file journal frames and export lines, old lines without
it read with `legacy_reason`, and the step index rule every backend's `append_step` keeps."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from mcp_durable.journal import CallIdentity, CallRecord, CallState, Reason, create_journal
from mcp_durable.journal.base import STEP
from mcp_durable.journal.model import legacy_reason
from mcp_durable.journal.record_json import record_from_json, record_to_json, step_data, step_index
from mcp_durable.journal.transfer import import_journal

T0 = 1_700_000_000.0


def record(
    state: CallState = CallState.RELEASED, *, reason: Reason | None = None, error: str | None = None, key: str = "k"
) -> CallRecord:
    return CallRecord(
        identity=CallIdentity("local", "refund", key),
        fingerprint="f" * 64,
        state=state,
        version=2,
        run_id="r1",
        attempts=1,
        created_at=T0,
        updated_at=T0 + 1,
        error=error,
        arguments=b'{"a":1}',
        reason=reason,
    )


def old_line(state: CallState, error: str | None, key: str = "k") -> dict[str, Any]:
    """A call record as a release before `reason` wrote it (frame `r` object and export line alike)."""
    return {
        "principal": "local",
        "tool": "refund",
        "key": key,
        "fingerprint": "f" * 64,
        "state": state.value,
        "version": 2,
        "run_id": "r1",
        "attempts": 1,
        "created_at": T0,
        "updated_at": T0 + 1,
        "owner": None,
        "lease_until": None,
        "completed_at": None,
        "expires_at": None,
        "error": error,
        "result": None,
        "arguments": '{"a":1}',
    }


def test_a_reason_is_written_under_its_own_name_and_read_back() -> None:
    for reason in Reason:
        written = record_to_json(record(reason=reason, error="cancelled by an operator"))
        assert written["reason"] == reason.value
        assert record_from_json(orjson.loads(orjson.dumps(written))).reason is reason


def test_no_reason_is_not_written_at_all() -> None:
    assert "reason" not in record_to_json(record(CallState.COMPLETED))
    assert "reason" not in record_to_json(record(CallState.PENDING))


@pytest.mark.parametrize(
    ("state", "error", "expected"),
    [
        (CallState.RELEASED, "cancelled by the task's requestor", Reason.REQUESTOR_CANCELLED),
        (CallState.RELEASED, "cancelled by an operator: wrong customer", Reason.OPERATOR_CANCELLED),
        (CallState.RELEASED, "forgotten by an operator", Reason.FORGOTTEN),
        (CallState.RELEASED, "re-run requested by an operator", Reason.RERUN),
        (CallState.RELEASED, "reconciled in the background: not applied", Reason.NOT_APPLIED),
        (CallState.RELEASED, "tool error (released by policy)", Reason.TOOL_ERROR),
        (CallState.RELEASED, "ValueError: boom", Reason.EXCEPTION),
        (CallState.RELEASED, None, Reason.EXCEPTION),
        (CallState.IN_DOUBT, None, Reason.LOST_OWNER),
        (CallState.IN_DOUBT, "parked after 3 attempts", Reason.PARKED),
        (CallState.IN_DOUBT, "reconcile failed: timeout", Reason.HOOK_FAILED),
        (CallState.IN_DOUBT, "upstream closed the connection", Reason.OUTCOME_UNKNOWN),
        (CallState.PENDING, None, None),
        (CallState.COMPLETED, None, None),
        (CallState.FAILED, "tool said no", None),
    ],
)
def test_a_line_of_an_earlier_release_reads_with_the_legacy_reason_of_its_text(
    state: CallState, error: str | None, expected: Reason | None
) -> None:
    read = record_from_json(old_line(state, error))
    assert read.reason is expected and read.reason == legacy_reason(state, error)
    assert read == record(state, reason=expected, error=error)


def test_an_explicit_null_reason_reads_like_an_absent_one() -> None:
    line = {**old_line(CallState.RELEASED, "cancelled by an operator"), "reason": None}
    assert record_from_json(line).reason is Reason.OPERATOR_CANCELLED


def test_an_unknown_reason_is_not_a_record() -> None:
    with pytest.raises(ValueError):
        record_from_json({**old_line(CallState.RELEASED, None), "reason": "bored"})


async def test_importing_an_export_of_an_earlier_release_gives_its_records_their_legacy_reasons() -> None:
    # The call lines after the header (`import_journal` reads those), as an earlier release wrote them.
    journal = create_journal("memory://")
    await journal.open()
    lines = [
        orjson.dumps({"type": "call", **old_line(CallState.RELEASED, "cancelled by an operator", "a")}),
        orjson.dumps({"type": "call", **old_line(CallState.IN_DOUBT, None, "b")}),
        orjson.dumps({"type": "call", **old_line(CallState.COMPLETED, None, "c")}),
    ]
    counts = await import_journal(journal, lines)
    assert counts.calls == 3
    reasons = [(await journal.get(CallIdentity("local", "refund", k))) for k in "abc"]
    assert [r.reason if r is not None else "missing" for r in reasons] == [
        Reason.OPERATOR_CANCELLED,
        Reason.LOST_OWNER,
        None,
    ]
    await journal.aclose()


# -- the step index rule -------------------------------------------------------------------------


def test_a_step_entry_is_one_of_type_step_whose_index_is_a_64_bit_integer() -> None:
    assert step_index(STEP, {"index": 0}) == 0
    assert step_index(STEP, {"index": (1 << 63) - 1, "x": 1}) == (1 << 63) - 1
    assert step_index("note", {"index": 0}) is None
    assert step_index(STEP, {"i": 0}) is None
    assert step_index(STEP, {"index": True}) is None  # a bool is not an index
    assert step_index(STEP, {"index": "0"}) is None
    assert step_index(STEP, {"index": 1 << 63}) is None
    assert step_index(STEP, [0]) is None


def test_step_data_sets_the_index_on_a_copy_and_refuses_another() -> None:
    data = {"v": 1}
    assert step_data(4, data) == {"v": 1, "index": 4} and data == {"v": 1}
    same = {"index": 4}
    assert step_data(4, same) is same
    with pytest.raises(ValueError):
        step_data(4, {"index": 5})
    with pytest.raises(ValueError):
        step_data(1 << 63, {})
    with pytest.raises(ValueError):
        step_data(True, {})
