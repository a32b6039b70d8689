"""The policies file (mcp_durable/policy_file.py): parsing, defaults from annotations, errors that
name the line and key, and `--print-config`'s TOML reading back as the same policies. Pure."""

from __future__ import annotations

import dataclasses

import pytest

from mcp_durable.errors import ConfigError
from mcp_durable.policy import ToolPolicy
from mcp_durable.policy_file import PASS_THROUGH, Policies, default_policy, parse_policies, render_policies

FILE = """\
[defaults]
retention = 600

[tools.refund]
key = "fields"
key_fields = ["order_id"]
in_doubt = "refuse"
wait = 2
lease = 10.5

[tools."send-mail"]
key = "required"
retention = "forever"
timeout = 45

[tools.report]
timeout = "none"

[tools.search]
durable = false

[tools.note]
key = "caller"
"""


def test_each_entry_maps_onto_a_tool_policy() -> None:
    policies = parse_policies(FILE, "p.toml")
    assert policies.tools["refund"] == ToolPolicy(
        key_fields=("order_id",), in_doubt="refuse", wait=2.0, lease=10.5, retention=600.0
    )
    assert policies.tools["send-mail"] == ToolPolicy(key="required", retention=None, timeout=45.0)
    assert policies.tools["report"] == ToolPolicy(timeout=None, retention=600.0)
    assert policies.tools["search"] == PASS_THROUGH
    note = policies.tools["note"]
    assert isinstance(note, ToolPolicy) and not note.idempotent and note.in_doubt_policy == "refuse"


def test_without_a_file_the_upstreams_annotations_decide() -> None:
    assert default_policy({"idempotentHint": True}) == ToolPolicy()
    assert default_policy({"idempotentHint": True, "readOnlyHint": True}) is None
    assert default_policy({"destructiveHint": True}) is None
    assert default_policy(None) is None
    policies = parse_policies(FILE)
    assert policies.for_tool("other", {"idempotentHint": True}) == ToolPolicy()
    assert policies.for_tool("search", {"idempotentHint": True}) is None  # the file wins
    assert policies.unknown(["refund", "search"]) == ["note", "report", "send-mail"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[tools.a]\nkey = "derived"\n\n[tools.b]\nwait = "soon"\n', r"p\.toml:5: tools\.b\.wait"),
        ("[tools.a]\nwiat = 3\n", r"p\.toml:2: tools\.a\.wiat: Extra inputs"),
        ("[defaults]\nlease = 0\n", r"p\.toml:2: defaults\.lease"),
        ('[tools.a]\nretention = "never"\n', r"p\.toml:2: tools\.a\.retention"),
        ("[tools.a]\ntimeout = 0\n", r"p\.toml:2: tools\.a\.timeout"),
        ('[tools.a]\ntimeout = "forever"\n', r"p\.toml:2: tools\.a\.timeout"),
        ('[tools.a]\nkey = "fields"\n', r'p\.toml:1: tools\.a: key = "fields" needs key_fields'),
        ('[tools.a]\nkey = "caller"\nkey_fields = ["x"]\n', r"p\.toml:1: tools\.a: key_fields is only used"),
        ('[tools.a]\nin_doubt = "reconcile"\n', r"p\.toml:2: tools\.a\.in_doubt"),
        ("tools = 3\n", r"p\.toml:1: tools"),
        ("[tools.a\n", r"p\.toml: not valid TOML"),
    ],
)
def test_a_bad_file_is_refused_naming_its_line_and_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_policies(text, "p.toml")


def _effective(policy: ToolPolicy | None) -> ToolPolicy | None:
    """The policy with its in-doubt default spelled out (the printed file spells it out)."""
    return None if policy is None else dataclasses.replace(policy, in_doubt=policy.in_doubt_policy)


def test_the_printed_config_reads_back_as_the_same_policies() -> None:
    policies = parse_policies(FILE)
    tools = [
        ("refund", None, "Refund an order"),
        ("send-mail", None, None),
        ("search", {"readOnlyHint": True}, None),
        ("note", None, None),
        ("lookup", {"idempotentHint": True}, None),
        ("drop", {"idempotentHint": False}, None),
        ("odd name", {"idempotentHint": True}, "two\nlines"),
    ]
    text = render_policies(tools, policies)
    again = parse_policies(text)
    for name, hints, _ in tools:
        assert _effective(again.for_tool(name, None)) == _effective(policies.for_tool(name, hints)), name
    assert render_policies(tools, again).count("[tools.") == len(tools)
    assert Policies().for_tool("x", None) is None


def test_the_policies_say_which_settings_the_file_chose_itself_for_each_tool() -> None:
    policies = parse_policies(
        """
[defaults]
wait = 5
[tools.refund]
tool_errors = "persist"
[tools.search]
durable = true
"""
    )
    assert policies.chose("refund", "tool_errors") and policies.chose("refund", "wait")
    assert not policies.chose("search", "tool_errors") and policies.chose("search", "wait")
    assert not policies.chose("unlisted", "wait")
    built = Policies({"refund": ToolPolicy()})  # in code: a listed tool's settings are as written
    assert built.chose("refund", "tool_errors") and not built.chose("other", "tool_errors")
