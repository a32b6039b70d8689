"""Keys: resolution order, validation, canonical JSON and fingerprints (pure functions)."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_durable import InvalidKeyError, MissingKeyError, ToolPolicy
from mcp_durable.keys import KEY_META, canonical_json, fingerprint, resolve_key, validate_key

ARGS = {"order_id": "O-1", "amount_cents": 500, "idempotency_key": "arg-key"}
EVERY_SOURCE = ToolPolicy(
    key_argument="idempotency_key", key_fn=lambda a: f"fn-{a['order_id']}", key_fields=("order_id",)
)


# -- resolution order ------------------------------------------------------------------------------


def test_the_meta_key_wins_over_every_other_source() -> None:
    assert resolve_key(EVERY_SOURCE, "refund", ARGS, {KEY_META: "meta-key"}) == "meta-key"


def test_the_key_argument_wins_over_the_key_function_and_key_fields() -> None:
    assert resolve_key(EVERY_SOURCE, "refund", ARGS, {}) == "arg-key"
    assert resolve_key(EVERY_SOURCE, "refund", ARGS, None) == "arg-key"


def test_an_unfilled_key_argument_falls_through_to_the_key_function() -> None:
    args = {**ARGS, "idempotency_key": None}
    assert resolve_key(EVERY_SOURCE, "refund", args, None) == "fn-O-1"
    del args["idempotency_key"]
    assert resolve_key(EVERY_SOURCE, "refund", args, None) == "fn-O-1"


def test_the_key_function_wins_over_key_fields() -> None:
    policy = ToolPolicy(key_fn=lambda a: "from-fn", key_fields=("order_id",))
    assert resolve_key(policy, "refund", ARGS, None) == "from-fn"


def test_a_single_readable_key_field_is_the_key_itself() -> None:
    assert resolve_key(ToolPolicy(key_fields=("order_id",)), "refund", ARGS, None) == "O-1"
    assert resolve_key(ToolPolicy(key_fields=("amount_cents",)), "refund", ARGS, None) == "500"


def test_several_key_fields_or_an_unprintable_one_are_hashed_into_a_valid_key() -> None:
    both = resolve_key(ToolPolicy(key_fields=("order_id", "amount_cents")), "refund", ARGS, None)
    assert both is not None and both.startswith("fields:") and len(both) == len("fields:") + 64
    reordered = resolve_key(ToolPolicy(key_fields=("amount_cents", "order_id")), "refund", ARGS, None)
    assert reordered == both  # the fields' object is canonical: order of declaration does not matter
    two_fields = ToolPolicy(key_fields=("order_id", "amount_cents"))
    other = resolve_key(two_fields, "refund", {**ARGS, "amount_cents": 501}, None)
    assert other != both
    long_value = resolve_key(ToolPolicy(key_fields=("order_id",)), "refund", {"order_id": "x" * 300}, None)
    assert long_value is not None and long_value.startswith("fields:")
    assert (resolve_key(ToolPolicy(key_fields=("flag",)), "t", {"flag": True}, None) or "").startswith("fields:")


def test_only_key_derived_makes_a_key_of_all_the_arguments() -> None:
    derived = ToolPolicy(key="derived")
    key = resolve_key(derived, "refund", ARGS, None)
    assert key == "sha256:" + hashlib.sha256(canonical_json(ARGS)).hexdigest()
    assert resolve_key(derived, "refund", dict(reversed(list(ARGS.items()))), None) == key
    assert resolve_key(derived, "refund", {**ARGS, "amount_cents": 1}, None) != key
    assert resolve_key(derived, "refund", ARGS, {KEY_META: "k"}) == "k"  # the caller's key first


def test_a_tool_registered_idempotent_without_a_key_source_has_no_key_and_runs_unjournaled() -> None:
    # Equal arguments are not always one effect (create, delete, create, delete): a key derived
    # from all of them would answer the second delete with the first one's result.
    assert resolve_key(ToolPolicy(), "delete_entities", ARGS, None) is None
    assert resolve_key(ToolPolicy(), "delete_entities", ARGS, {KEY_META: "k"}) == "k"
    assert resolve_key(ToolPolicy(key_fields=("order_id",)), "refund", ARGS, None) == ARGS["order_id"]


def test_a_tool_not_registered_idempotent_without_a_key_has_none() -> None:
    assert resolve_key(ToolPolicy(idempotent=False), "send", ARGS, None) is None
    assert resolve_key(ToolPolicy(idempotent=False), "send", ARGS, {KEY_META: "k"}) == "k"


def test_a_required_key_must_come_from_the_caller() -> None:
    required = ToolPolicy(key="required", key_fields=("order_id",))
    with pytest.raises(MissingKeyError) as missing:
        resolve_key(required, "charge", ARGS, {"other/meta": 1})
    assert missing.value.tool == "charge" and missing.value.code == "missing_key"
    assert resolve_key(required, "charge", ARGS, {KEY_META: "k"}) == "k"
    with_argument = ToolPolicy(key="required", key_argument="idempotency_key")
    assert resolve_key(with_argument, "charge", ARGS, None) == "arg-key"


def test_an_invalid_meta_key_is_refused_rather_than_replaced_by_another_source() -> None:
    with pytest.raises(InvalidKeyError):
        resolve_key(EVERY_SOURCE, "refund", ARGS, {KEY_META: "bad\nkey"})
    with pytest.raises(InvalidKeyError):
        resolve_key(EVERY_SOURCE, "refund", ARGS, {KEY_META: None})


def test_keys_from_the_key_argument_or_function_are_validated_too() -> None:
    with pytest.raises(InvalidKeyError):
        resolve_key(ToolPolicy(key_argument="k"), "t", {"k": "x" * 256}, None)
    with pytest.raises(InvalidKeyError):
        resolve_key(ToolPolicy(key_argument="k"), "t", {"k": 17}, None)
    with pytest.raises(InvalidKeyError):
        resolve_key(ToolPolicy(key_fn=lambda a: ""), "t", {}, None)
    with pytest.raises(InvalidKeyError):
        # A key function that breaks its declared type, as an untyped caller's may.
        resolve_key(ToolPolicy(key_fn=lambda a: 7), "t", {}, None)  # type: ignore[arg-type,return-value]


def test_a_missing_key_field_is_an_invalid_key() -> None:
    with pytest.raises(InvalidKeyError) as error:
        resolve_key(ToolPolicy(key_fields=("order_id", "line")), "refund", ARGS, None)
    assert "line" in error.value.reason


# -- validation ------------------------------------------------------------------------------------

PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F))


@pytest.mark.parametrize("key", ["a", "k" * 255, PRINTABLE, " leading and trailing ", "~"])
def test_one_to_255_printable_ascii_characters_are_a_valid_key(key: str) -> None:
    assert validate_key("t", key) == key


@pytest.mark.parametrize(
    "key",
    ["", "k" * 256, "a\x00b", "a\tb", "a\nb", "a\rb", "\x1f", "\x7f", "é", "ключ", "\u200b", "a\ud800"],
)
def test_anything_else_is_an_invalid_key(key: str) -> None:
    with pytest.raises(InvalidKeyError) as error:
        validate_key("refund", key)
    assert error.value.tool == "refund" and error.value.code == "invalid_key" and error.value.reason


@pytest.mark.parametrize("key", [12345, 1.5, True, None, {"id": 1}, ["k"], b"bytes"])
def test_a_key_that_is_not_a_string_is_an_invalid_key(key: Any) -> None:
    with pytest.raises(InvalidKeyError, match="must be a string"):
        validate_key("refund", key)


@given(st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=255))
def test_every_printable_ascii_string_up_to_255_characters_is_valid(key: str) -> None:
    assert validate_key("t", key) == key


# -- canonical JSON and fingerprints ---------------------------------------------------------------


def test_canonical_json_sorts_keys_at_every_depth_without_whitespace() -> None:
    value = {"b": 1, "a": {"d": [3, {"z": 0, "y": None}], "c": "é"}}
    assert canonical_json(value) == '{"a":{"c":"é","d":[3,{"y":null,"z":0}]},"b":1}'.encode()


def test_the_fingerprint_is_the_sha256_of_the_canonical_json() -> None:
    assert fingerprint(ARGS) == hashlib.sha256(canonical_json(ARGS)).hexdigest()
    assert len(fingerprint({})) == 64


json_values = st.recursive(
    # the journal's JSON: 64-bit ints
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


def _shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = [(k, _shuffled(v, rng)) for k, v in value.items()]
        rng.shuffle(items)
        return dict(items)
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


@given(st.dictionaries(st.text(max_size=6), json_values, max_size=6), st.randoms())
def test_the_fingerprint_does_not_depend_on_the_order_of_object_keys(args: dict[str, Any], rng: random.Random) -> None:
    assert fingerprint(_shuffled(args, rng)) == fingerprint(args)


def test_the_fingerprint_changes_with_any_value_and_keeps_list_order() -> None:
    assert fingerprint({"a": [1, 2]}) != fingerprint({"a": [2, 1]})
    assert fingerprint({"a": 1}) != fingerprint({"a": "1"})
    assert fingerprint({"a": None}) != fingerprint({})


# -- other `_meta` names, fingerprint fields, interactive tools --------------------------------------


def test_other_meta_names_are_read_in_order_after_our_own() -> None:
    from mcp_durable.keys import resolve_key

    policy = ToolPolicy(key_meta=("idempotency_key", "idempotencyKey"))
    args = {"text": "a"}
    assert resolve_key(policy, "t", args, {"idempotency_key": "theirs", "idempotencyKey": "later"}) == "theirs"
    assert resolve_key(policy, "t", args, {"idempotencyKey": "later"}) == "later"
    assert resolve_key(policy, "t", args, {KEY_META: "ours", "idempotency_key": "theirs"}) == "ours"
    assert resolve_key(ToolPolicy(), "t", args, {"idempotency_key": "ignored"}) is None
    with pytest.raises(InvalidKeyError):
        resolve_key(policy, "t", args, {"idempotency_key": "bad\nkey"})


def test_a_derived_key_and_the_fingerprint_leave_out_excluded_arguments() -> None:
    from mcp_durable.keys import policy_fingerprint

    policy = ToolPolicy(fingerprint_exclude=("reason",))
    one = {"order_id": "O-1", "reason": "customer asked"}
    two = {"order_id": "O-1", "reason": "the customer asked for it"}
    assert policy_fingerprint(policy, one) == policy_fingerprint(policy, two) == fingerprint({"order_id": "O-1"})
    assert resolve_key(policy, "t", one, None) == resolve_key(policy, "t", two, None)
    assert policy_fingerprint(ToolPolicy(), one) != policy_fingerprint(ToolPolicy(), two)


def test_an_interactive_tool_takes_its_key_only_from_the_caller() -> None:
    policy = ToolPolicy(interactive=True, key_argument="ref")
    assert resolve_key(policy, "t", {"dest": "X"}, None) is None  # never derived from the arguments
    assert resolve_key(policy, "t", {"dest": "X"}, {KEY_META: "k"}) == "k"
    assert resolve_key(policy, "t", {"dest": "X", "ref": "r"}, None) == "r"
    with pytest.raises(MissingKeyError):
        resolve_key(ToolPolicy(interactive=True, key="required"), "t", {"dest": "X"}, None)
