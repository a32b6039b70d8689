"""The file journal's compact call frames (`file/codec.py`, kind `c`): every record round-trips
exactly (each field's value and type, the sign of a zero time included) whatever its values, the
shortenings are taken where they apply, `verify` reads what the journal reads, and a frame of the
benchmark's shape stays small by construction."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_durable.errors import JournalError
from mcp_durable.journal import CallIdentity, CallRecord, CallState, Reason
from mcp_durable.journal.file.codec import (
    EMBED_MAX,
    RECORD_LAYOUT,
    call_payload,
    index_fields,
    record_from_dict,
)
from mcp_durable.journal.file.framing import encode_frame
from mcp_durable.journal.file.verify import payload_problem
from mcp_durable.journal.record_json import record_to_json

T0 = 1_796_321_750.0115292  # a time of the benchmark's (18 characters)
FP = "f3013f933b9fb80ab6d995e7ad9da36f683837ba1d81e950c943d40111eac2f0"
RESULT = b'{"content":[{"type":"text","text":"ok"}],"structuredContent":{"result":"ok"},"isError":false}'


def read_back(record: CallRecord) -> CallRecord:
    """`record` through its frame payload, as the journal reads it (and `verify` finds no fault)."""
    payload = call_payload(record)
    assert b"\n" not in payload  # a frame is one line
    assert payload_problem(payload) is None
    d = orjson.loads(payload)
    assert d["t"] == "c"
    decoded = record_from_dict(d["r"])
    identity, version, state, created, expires, task_id = index_fields(d["r"])
    assert (identity, version, state, task_id) == (decoded.identity, decoded.version, decoded.state, decoded.task_id)
    assert_exact(created, decoded.created_at)
    assert_exact(expires, decoded.expires_at)
    return decoded


def assert_exact(a: Any, b: Any) -> None:
    """The same value of the same type; for floats the same bits (-0.0 is not 0.0)."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, float):
        assert a == b and math.copysign(1.0, a) == math.copysign(1.0, b), (a, b)
    else:
        assert a == b, (a, b)


def assert_same_record(a: CallRecord, b: CallRecord) -> None:
    for f in dataclasses.fields(CallRecord):
        assert_exact(getattr(a, f.name), getattr(b, f.name))


def claimed(**changes: Any) -> CallRecord:
    record = CallRecord(
        identity=CallIdentity("local", "noop", "sha256:" + FP),
        fingerprint=FP,
        state=CallState.PENDING,
        version=1,
        run_id="755210a656c7cd1e78637d147dfca3f7",
        attempts=1,
        created_at=T0,
        updated_at=T0,
        owner="4b2cbece7bbb",
        lease_until=T0 + 30,
        arguments=b'{"n":1}',
    )
    return dataclasses.replace(record, **changes)


def completed(record: CallRecord, now: float = T0 + 0.0005806, result: bytes = RESULT) -> CallRecord:
    return record.evolve(
        state=CallState.COMPLETED,
        owner=None,
        lease_until=None,
        updated_at=now,
        completed_at=now,
        expires_at=now + 86_400,
        result=result,
    )


# -- every state, reason and shape ------------------------------------------------------------------


@pytest.mark.parametrize("state", list(CallState))
@pytest.mark.parametrize("reason", [None, *Reason])
def test_every_state_and_reason_round_trips(state: CallState, reason: Reason | None) -> None:
    record = claimed(state=state, reason=reason, error=None if reason is None else f"because {reason.value}")
    assert_same_record(read_back(record), record)


def test_the_benchmark_call_round_trips_with_every_shortening_taken() -> None:
    claim = claimed()
    done = completed(claim)
    for record in (claim, done):
        assert_same_record(read_back(record), record)
    r = orjson.loads(call_payload(done))["r"]
    at = {name: r[i] if i < len(r) else None for i, name in enumerate(RECORD_LAYOUT)}
    assert at["key"] == 0  # derived from the fingerprint, not stored
    assert isinstance(at["fingerprint"], list) and len(at["fingerprint"][0]) == 43  # 32 bytes, not 64 hex digits
    assert isinstance(at["run_id"], list) and len(at["run_id"][0]) == 22
    assert at["completed_at"] == [0] and at["expires_at"] == [86400]  # after updated_at
    assert at["result"] == orjson.loads(RESULT)  # the JSON itself, no quotes escaped
    assert at["arguments"] == {"n": 1}
    r = orjson.loads(call_payload(claim))["r"]
    assert r[RECORD_LAYOUT.index("updated_at")] == [0] and r[RECORD_LAYOUT.index("lease_until")] == [30]
    assert len(r) == RECORD_LAYOUT.index("lease_until") + 1  # the nulls after it are left out


def test_a_call_of_the_benchmark_takes_two_small_frames() -> None:
    # Structural, not timed: benchmark case 6 stores a claim and a completion per call (the
    # superseded claim stays until a compaction), plus the index snapshot's share (about 90
    # bytes a record): these two frames keep it under 700 bytes a record (1,421 before `c`).
    claim = claimed()
    done = completed(claim)
    sizes = [len(encode_frame(1 << 20, call_payload(r))) for r in (claim, done)]
    assert sum(sizes) <= 560, sizes
    legacy = [
        len(orjson.dumps({"t": "call", "op": "swap", "h": "0" * 32, "r": record_to_json(r)})) for r in (claim, done)
    ]
    assert sum(sizes) < sum(legacy) / 2, (sizes, legacy)


def test_unicode_bytes_that_are_not_utf8_and_a_large_result_round_trip() -> None:
    large = orjson.dumps({"rows": [{"id": i, "name": f"café ☃ {i}", "v": i * 1.5} for i in range(20_000)]})
    assert len(large) > EMBED_MAX
    cases = [
        claimed(identity=CallIdentity("ålice ☃", "réfund", "O-ü-1"), error="refusé: ☃", task_id="tâche-1"),
        completed(claimed(arguments=bytes(range(256))), result=bytes(range(256))[::-1]),
        completed(claimed(), result=large),  # over the size kept as JSON: text
        completed(claimed(), result=b'{"a":1, "b":2}'),  # spaces
        completed(claimed(), result=b'{"a":1,"a":2}'),  # a repeated key: not what a parse writes back
        completed(claimed(), result=b'{"e":"\\u00e9","f":1e16}'),  # another writer's spellings
        completed(claimed(), result=b'["not", "an object"]'),
        completed(claimed(), result=b""),
        completed(claimed(), result=b"{"),
        claimed(fingerprint="F" * 64, run_id="r/2"),  # upper-case hex, not hex: kept as they are
        claimed(identity=CallIdentity("p", "t", "sha256:" + "a" * 64)),  # looks derived, is not
    ]
    for record in cases:
        assert_same_record(read_back(record), record)


def test_times_round_trip_exactly_whatever_their_values() -> None:
    for created, later in [
        (T0, T0),
        (0.0, -0.0),
        (-0.0, 0.0),
        (1e-300, 5e-324),
        (1e300, 1e300 + 1e285),
        (T0, T0 + 0.1),
        (1, 31),  # integers stay integers
        (1.0, 31),
        (T0, 1e308),
    ]:
        record = claimed(
            created_at=created, updated_at=later, lease_until=later, completed_at=later, expires_at=created
        )
        assert_same_record(read_back(record), record)


@pytest.mark.parametrize(
    "r",
    [
        ["local", "noop", 0, "f", 9, 1, "run", 1, T0, [0]],  # an unknown state code
        ["local", "noop", 0, "f", 0, 1, "run", 1, T0],  # too short
        ["local", "noop", 0, "f", 0, "1", "run", 1, T0, [0]],  # a version that is not an integer
        ["local", "noop", 0, "f", 0, 1, "run", 1, T0, [0, 1]],  # not a relative time
        ["local", "noop", 0, "f", 0, 1, "run", 1, T0, [0], [1]],  # arguments: base64 of nothing valid
        ["local", "noop", 0, ["!"], 0, 1, "run", 1, T0, [0]],  # a fingerprint that is not base64
        ["local", "noop", 0, "f", 0, 1, "run", 1, T0, [0], None, None, None, None, None, None, None, None, "x"],
    ],
)
def test_an_array_no_release_wrote_is_a_journal_error_and_a_verify_problem(r: list[Any]) -> None:
    with pytest.raises(JournalError):
        record_from_dict(r)
    assert payload_problem(orjson.dumps({"t": "c", "r": r})) is not None


# -- any record -----------------------------------------------------------------------------------

hex_digits = st.text(alphabet="0123456789abcdef", min_size=0, max_size=80)
strings = st.one_of(st.text(max_size=40), hex_digits, st.just(FP), st.text(alphabet="0123456789ABCDEF", max_size=40))
finite = st.floats(allow_nan=False, allow_infinity=False)
times = st.one_of(finite, st.integers(min_value=-(2**53), max_value=2**53), st.just(T0))
deltas = st.one_of(st.just(0), st.just(30), st.just(86_400.0), st.just(-0.0), finite, st.integers(-(10**6), 10**6))
json_objects = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | finite | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)
stored_bytes = st.one_of(
    st.none(),
    st.binary(max_size=64),
    st.text(max_size=40).map(str.encode),
    st.dictionaries(st.text(max_size=5), json_objects, max_size=5).map(orjson.dumps),
    json_objects.map(lambda v: orjson.dumps(v, option=orjson.OPT_INDENT_2)),
)


@st.composite
def records(draw: st.DrawFn) -> CallRecord:
    def after(base: Any) -> Any:
        """A time near `base` (what the engine writes) or any time at all."""
        if isinstance(base, float | int) and draw(st.booleans()):
            d = draw(deltas)
            return base + d if math.isfinite(base + d) else base
        return draw(times)

    created = draw(times)
    updated = after(created)
    fingerprint = draw(strings)
    key = draw(st.one_of(st.text(max_size=20), st.just("sha256:" + fingerprint), st.just("sha256:")))
    return CallRecord(
        identity=CallIdentity(draw(st.text(max_size=12)), draw(st.text(max_size=12)), key),
        fingerprint=fingerprint,
        state=draw(st.sampled_from(CallState)),
        version=draw(st.integers(-(2**63), 2**63 - 1)),
        run_id=draw(strings),
        attempts=draw(st.integers(0, 2**32)),
        created_at=created,
        updated_at=updated,
        owner=draw(st.none() | strings),
        lease_until=draw(st.none()) if draw(st.booleans()) else after(updated),
        completed_at=draw(st.none()) if draw(st.booleans()) else after(updated),
        expires_at=draw(st.none()) if draw(st.booleans()) else after(updated),
        result=draw(stored_bytes),
        error=draw(st.none() | st.text(max_size=20)),
        arguments=draw(stored_bytes),
        task_id=draw(st.none() | st.text(max_size=20)),
        reason=draw(st.none() | st.sampled_from(Reason)),
    )


@settings(max_examples=400)
@given(records())
def test_any_record_round_trips_exactly(record: CallRecord) -> None:
    assert_same_record(read_back(record), record)
