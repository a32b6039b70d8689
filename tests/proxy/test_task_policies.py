"""`task_support` and `task_after` in the policies file (mcp_durable/policy_file.py): what they map
onto, the faults refused with the file, the line and the key, and `--print-config` keeping them."""

from __future__ import annotations

import pytest

from mcp_durable.errors import ConfigError
from mcp_durable.policy import ToolPolicy
from mcp_durable.policy_file import PASS_THROUGH, parse_policies, render_policies
from tests.docs.snippets import REPO, blocks

FILE = """\
[defaults]
task_after = 0.5

[tools.report]
key = "required"
task_support = "required"

[tools.refund]
task_support = "optional"
task_after = 3

[tools.lookup]
durable = false

[tools.note]
key = "caller"
"""


def test_task_support_and_task_after_map_onto_the_tool_policy() -> None:
    policies = parse_policies(FILE, "p.toml")
    assert policies.tools["report"] == ToolPolicy(key="required", task_support="required", task_after=0.5)
    assert policies.tools["refund"] == ToolPolicy(task_support="optional", task_after=3.0)
    assert policies.tools["lookup"] == PASS_THROUGH  # `[defaults]` apply to durable tools only
    note = policies.tools["note"]
    assert isinstance(note, ToolPolicy) and note.task_support == "forbidden"  # the default
    assert policies.chose("refund", "task_support") and not policies.chose("note", "task_support")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[tools.a]\nkey = "required"\ntask_support = "always"\n',
            r"p\.toml:3: tools\.a\.task_support: Input should be 'forbidden', 'optional' or 'required'",
        ),
        ('[defaults]\ntask_support = "yes"\n', r"p\.toml:2: defaults\.task_support: Input should be"),
        ("[tools.a]\ntask_support = true\n", r"p\.toml:2: tools\.a\.task_support: Input should be"),
        ("[tools.a]\ntask_after = -1\n", r"p\.toml:2: tools\.a\.task_after: Input should be greater than or equal"),
        (
            '[tools.a]\ndurable = false\ntask_support = "optional"\n',
            r'p\.toml:1: tools\.a: task_support = "optional" needs a durable tool \(a task is a journaled call\)',
        ),
    ],
)
def test_a_bad_task_setting_is_refused_naming_its_line_and_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_policies(text, "p.toml")


def test_the_printed_config_keeps_a_tools_task_support() -> None:
    policies = parse_policies(FILE)
    text = render_policies([("report", None, None), ("refund", None, None), ("note", None, None)], policies)
    again = parse_policies(text)
    for name in ("report", "refund", "note"):
        before, after = policies.tools[name], again.tools[name]
        assert isinstance(before, ToolPolicy) and isinstance(after, ToolPolicy)
        assert after.task_support == before.task_support, name
        if before.task_support != "forbidden":  # (task_after means nothing without tasks)
            assert after.task_after == before.task_after, name
    assert 'task_support = "required"' in text and text.count("task_support") == 2  # forbidden: not written


def test_the_policies_file_of_docs_proxy_md_reads_as_it_says() -> None:
    """The worked policies file of docs/proxy.md is a valid file, with the task settings it shows."""
    [shown] = [block for block in blocks(REPO / "docs" / "proxy.md") if block.lang == "toml"]
    policies = parse_policies(shown.text, shown.where)
    refund = policies.tools["refund"]
    assert isinstance(refund, ToolPolicy)
    assert (refund.task_support, refund.task_after, refund.key_fields) == ("optional", 2.0, ("order_id",))
