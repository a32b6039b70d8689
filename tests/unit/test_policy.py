"""Tool policies: defaults, derived settings, and every invalid setting refused as a `ConfigError`."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from mcp_durable import ConfigError, DurableError, ToolPolicy
from mcp_durable.policy import DEFAULT_RETENTION, NOT_APPLIED, as_policy


async def _hook(key: str, arguments: Any) -> Any:
    return NOT_APPLIED


def test_the_defaults_are_an_idempotent_auto_keyed_policy_that_persists_tool_errors() -> None:
    policy = ToolPolicy()
    assert policy.key == "auto" and policy.idempotent
    assert policy.tool_errors == "persist" and policy.exceptions == "release"
    assert policy.retention == DEFAULT_RETENTION == 24 * 3600
    assert policy.in_doubt_policy == "retry"


def test_the_in_doubt_policy_defaults_by_idempotence_and_reconcile_hook() -> None:
    assert ToolPolicy(idempotent=False).in_doubt_policy == "refuse"
    assert ToolPolicy(reconcile=_hook).in_doubt_policy == "reconcile"
    assert ToolPolicy(idempotent=False, reconcile=_hook).in_doubt_policy == "reconcile"
    assert ToolPolicy(in_doubt="refuse", reconcile=_hook).in_doubt_policy == "refuse"
    assert ToolPolicy(idempotent=False, in_doubt="retry").in_doubt_policy == "retry"


def test_the_heartbeat_renews_the_lease_three_times_per_lease() -> None:
    assert ToolPolicy(lease=9.0).heartbeat_interval == 3.0


def test_sequences_are_stored_as_tuples_and_a_single_name_as_one_field() -> None:
    # A list or a bare name where a tuple is declared, as untyped callers and TOML pass them.
    assert ToolPolicy(key_fields=["order_id", "line"]).key_fields == ("order_id", "line")  # type: ignore[arg-type]
    assert ToolPolicy(key_fields="order_id").key_fields == ("order_id",)  # type: ignore[arg-type]
    assert ToolPolicy(sensitive=["card"]).sensitive == ("card",)  # type: ignore[arg-type]
    assert ToolPolicy(sensitive="card").sensitive == ("card",)  # type: ignore[arg-type]


def test_a_policy_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        ToolPolicy().wait = 1.0  # type: ignore[misc]  # the assignment that must fail


def test_retention_none_keeps_records_forever_and_zero_wait_is_allowed() -> None:
    assert ToolPolicy(retention=None).retention is None
    assert ToolPolicy(wait=0).wait == 0


INVALID: dict[str, dict[str, Any]] = {
    "key mode": {"key": "sometimes"},
    "negative wait": {"wait": -1},
    "zero lease": {"lease": 0},
    "negative lease": {"lease": -5},
    "zero attempts": {"max_attempts": 0},
    "zero retention": {"retention": 0},
    "negative retention": {"retention": -1.0},
    "in-doubt mode": {"in_doubt": "ignore"},
    "reconcile without hook": {"in_doubt": "reconcile"},
    "tool error handling": {"tool_errors": "ignore"},
    "exception handling": {"exceptions": "swallow"},
    "empty key fields": {"key_fields": ()},
    "empty key argument": {"key_argument": ""},
    "key function not callable": {"key_fn": "order_id"},
    "reconcile hook not callable": {"reconcile": "check"},
    "NaN wait": {"wait": float("nan")},
    "NaN lease": {"lease": float("nan")},
}


@pytest.mark.parametrize("settings", list(INVALID.values()), ids=list(INVALID))
def test_an_invalid_setting_is_a_config_error(settings: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as error:
        ToolPolicy(**settings)
    assert isinstance(error.value, DurableError) and error.value.code == "config_error"
    assert error.value.message


def test_as_policy_normalises_the_durable_argument() -> None:
    assert as_policy(None) is None and as_policy(False) is None
    assert as_policy(True) == ToolPolicy()
    custom = ToolPolicy(wait=1.0)
    assert as_policy(custom) is custom
    with pytest.raises(ConfigError):  # wrong types on purpose: what an untyped caller may pass
        as_policy("yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        as_policy({"wait": 1})  # type: ignore[arg-type]


# -- fingerprint fields, key `_meta` names, interactive tools ----------------------------------------


def test_fingerprint_names_and_key_meta_names_are_stored_as_tuples() -> None:
    # A list or a bare name where a tuple is declared, as untyped callers and TOML pass them.
    assert ToolPolicy(fingerprint_fields="order_id").fingerprint_fields == ("order_id",)  # type: ignore[arg-type]
    assert ToolPolicy(fingerprint_exclude=["reason"]).fingerprint_exclude == ("reason",)  # type: ignore[arg-type]
    assert ToolPolicy(key_meta="idempotency_key").key_meta == ("idempotency_key",)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "settings",
    [
        {"fingerprint_fields": ("a",), "fingerprint_exclude": ("b",)},
        {"fingerprint_fields": ()},
        {"fingerprint_exclude": ("",)},
        {"key_meta": (5,)},
        {"interactive": True, "key_fields": ("order_id",)},
        {"interactive": True, "key_fn": lambda arguments: "k"},
    ],
    ids=["both", "no-fields", "empty-name", "not-a-name", "interactive-fields", "interactive-fn"],
)
def test_contradictory_fingerprint_and_key_settings_are_refused(settings: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        ToolPolicy(**settings)


def test_the_fingerprinted_arguments_are_the_named_ones_or_all_but_the_excluded() -> None:
    arguments = {"order_id": "O-1", "amount_cents": 5, "reason": "typo"}
    assert ToolPolicy().fingerprinted(arguments) is arguments
    assert ToolPolicy(fingerprint_fields=("order_id",)).fingerprinted(arguments) == {"order_id": "O-1"}
    assert ToolPolicy(fingerprint_exclude=("reason",)).fingerprinted(arguments) == {
        "order_id": "O-1",
        "amount_cents": 5,
    }


def test_an_interactive_tool_does_not_advertise_idempotence() -> None:
    assert ToolPolicy().advertised_idempotent and not ToolPolicy(interactive=True).advertised_idempotent
