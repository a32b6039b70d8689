"""`CallRecord.evolve` is spelled out field by field (for speed): it must change exactly what it is asked to."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from mcp_durable.journal.model import CallIdentity, CallRecord, CallState

FIELDS = [f.name for f in dataclasses.fields(CallRecord)]


def full_record() -> CallRecord:
    return CallRecord(
        identity=CallIdentity("p", "t", "k"),
        fingerprint="f",
        state=CallState.PENDING,
        version=7,
        run_id="r",
        attempts=2,
        created_at=1.0,
        updated_at=2.0,
        owner="o",
        lease_until=3.0,
        completed_at=4.0,
        expires_at=5.0,
        result=b"x",
        error="e",
        arguments=b"{}",
    )


@pytest.mark.parametrize("name", [n for n in FIELDS if n != "version"])
def test_evolve_changes_one_field_bumps_the_version_and_keeps_every_other(name: str) -> None:
    record, marker = full_record(), object()
    change: dict[str, Any] = {name: marker}  # a parametrized field name, so typed loosely
    evolved = record.evolve(**change)
    for other in FIELDS:
        expected = marker if other == name else record.version + 1 if other == "version" else getattr(record, other)
        assert getattr(evolved, other) is expected or getattr(evolved, other) == expected, other
    assert evolved == dataclasses.replace(record, version=record.version + 1, **change)


def test_evolve_refuses_unknown_fields_and_the_version() -> None:
    with pytest.raises(TypeError):
        full_record().evolve(colour="red")
    with pytest.raises(TypeError):
        full_record().evolve(version=1)
