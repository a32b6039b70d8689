"""`prevalidated.makes_non_finite`: which argument models need their validated values checked
for non-finite numbers again (the face skips that walk for the others)."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any

import pytest
from pydantic import AfterValidator, BaseModel, Field, create_model

from mcp_durable.server.prevalidated import makes_non_finite


class Inner(BaseModel):
    ratio: float


class Plain(BaseModel):
    name: str


def schema_of(annotation: Any) -> Any:
    model: type[BaseModel] = create_model("Arguments", value=(annotation, ...))
    return model.__pydantic_core_schema__


@pytest.mark.parametrize(
    "annotation",
    [
        float,
        Decimal,
        float | None,
        list[float],
        dict[str, float],
        tuple[int, float],
        Inner,
        list[Inner],
        Annotated[int, AfterValidator(lambda v: v)],  # the author's code may return anything
        Annotated[list[str], Field(default_factory=list)],
    ],
)
def test_a_model_that_can_make_a_float_or_runs_code_is_checked_again(annotation: Any) -> None:
    assert makes_non_finite(schema_of(annotation))


@pytest.mark.parametrize("annotation", [str, int, bool, list[str], dict[str, int], int | None, Plain, list[Plain], Any])
def test_a_model_without_floats_or_code_is_not(annotation: Any) -> None:
    assert not makes_non_finite(schema_of(annotation))
