"""The one table from a refusal code to its HTTP status and JSON-RPC code (`wire_errors.WIRE`):
every code an error of `errors.py` carries has its row, the statuses are the ones documented,
and a `ConfigError` has none (it is raised again wherever a refusal would be built)."""

from __future__ import annotations

import inspect

import pytest
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS

from mcp_durable import errors, wire_errors
from mcp_durable.server.results import refusal, refusal_error
from mcp_durable.wire_errors import WIRE, wire_of


def _codes() -> set[str]:
    return {cls.code for cls in vars(errors).values() if inspect.isclass(cls) and issubclass(cls, errors.DurableError)}


def test_every_code_but_config_error_has_a_row_and_the_table_nothing_else() -> None:
    assert set(WIRE) == _codes() - {errors.ConfigError.code}


def test_the_statuses_are_the_documented_ones() -> None:
    statuses = {code: wire.status for code, wire in WIRE.items()}
    assert statuses == {
        "missing_key": 400,
        "invalid_key": 400,
        "non_finite_argument": 400,
        "arguments_too_deep": 400,
        "too_large": 400,
        "not_serialisable": 400,
        "key_reuse": 422,
        "forbidden": 403,
        "not_found": 404,
        "in_progress": 409,
        "in_doubt": 409,
        "cancelled": 409,
        "operator_error": 409,
        "determinism_error": 500,
        "internal": 500,
        "upstream_unavailable": 502,
        "journal_unavailable": 503,
    }


def test_the_json_rpc_code_is_invalid_params_for_a_refusal_and_internal_error_for_a_server_failure() -> None:
    assert (wire_errors.INVALID_PARAMS, wire_errors.INTERNAL_ERROR) == (INVALID_PARAMS, INTERNAL_ERROR)
    for code, wire in WIRE.items():
        assert wire.jsonrpc == (INVALID_PARAMS if wire.status < 500 else INTERNAL_ERROR), code


def test_each_error_is_answered_by_its_codes_row() -> None:
    cases = [
        errors.ForbiddenError("alice"),
        errors.OperatorError("not in doubt"),
        errors.CallNotFoundError("ship", "k"),
        errors.JournalLockedError("/j", "pid 1"),
        errors.KeyReuseError("ship", "k"),
        errors.UpstreamUnavailableError("http://up", "refused"),
    ]
    assert [(wire_of(e).status, refusal_error(e).error.code) for e in cases] == [
        (403, -32602),
        (409, -32602),
        (404, -32602),
        (503, -32603),
        (422, -32602),
        (502, -32603),
    ]
    error = refusal_error(errors.CallNotFoundError("ship", "k"), uri="journal://calls/ship/k")
    assert error.error.data == {
        "uri": "journal://calls/ship/k",
        "error": "not_found",
        "message": "no call ship/k",
        "tool": "ship",
        "key": "k",
    }


def test_a_code_missing_from_the_table_is_answered_as_internal() -> None:
    class Unlisted(errors.DurableError):
        code = "something_new"

    assert wire_of(Unlisted("x")) == WIRE["internal"]


def test_a_config_error_is_raised_again_wherever_a_refusal_would_be_built() -> None:
    mistake = errors.ConfigError("key must be 'auto' or 'required'")
    for build in (wire_of, refusal, refusal_error):
        with pytest.raises(errors.ConfigError) as raised:
            build(mistake)
        assert raised.value is mistake
