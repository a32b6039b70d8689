"""Every error a call can be refused with has its own machine-readable code.

A `DurableError` subclass without a `code` of its own answers `internal`, which tells a client
nothing it can act on; only the bases that group others (and are never raised themselves) may
keep it.
"""

from __future__ import annotations

import inspect

from mcp_durable import errors

#: Bases that group other errors and are never raised as such.
GROUPING_BASES = {"DurableError", "LimitExceededError", "_OfTool", "_OfCall"}


def _error_classes() -> dict[str, type[errors.DurableError]]:
    return {
        name: value
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, errors.DurableError) and value.__module__ == errors.__name__
    }


def test_every_raised_error_has_a_code_of_its_own() -> None:
    internal = sorted(name for name, cls in _error_classes().items() if cls.code == "internal")
    assert internal == sorted(GROUPING_BASES)


def test_a_determinism_error_carries_its_code_and_fields() -> None:
    error = errors.DeterminismError(1, "reserve", "pack")
    assert error.code == "determinism_error"
    assert (error.step_index, error.expected, error.got) == (1, "reserve", "pack")
