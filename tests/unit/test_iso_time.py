"""`views.iso` (the time in `_meta`, resources and task views) formats as `datetime` does, from whole
seconds it formats once each."""

from __future__ import annotations

import random
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from mcp_durable.views import iso


def reference(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


@given(st.floats(min_value=-2_000_000_000.0, max_value=4_000_000_000.0, allow_nan=False))
def test_any_timestamp_reads_as_datetime_writes_it(ts: float) -> None:
    assert iso(ts) == reference(ts)


def test_the_edges_of_rounding_read_as_datetime_writes_them() -> None:
    # Halves of a microsecond (rounded to even), values that round up into the next second,
    # whole seconds (no fraction written), and times of today, as `time.time()` gives them.
    base = 1_764_000_000
    edges = [
        base + 0.0000005,
        base + 0.0000015,
        base + 0.9999995,
        base + 0.9999996,
        base + 0.9999994,
        float(base),
        base + 0.5,
        base - 0.0000005,
        -0.0000005,
        -1.9999996,
        0.0,
        1e-7,
        -1e-7,
    ]
    rng = random.Random(7)
    edges += [base + rng.random() * 86_400 for _ in range(20_000)]
    edges += [base + n + k / 1e6 + 5e-7 for n in range(50) for k in range(0, 1_000_000, 99_991)]
    for ts in edges:
        assert iso(ts) == reference(ts), ts


def test_none_stays_none() -> None:
    assert iso(None) is None
