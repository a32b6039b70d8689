"""`uris.record_uri` (no SDK import) expands like the SDK's RFC 6570 `UriTemplate`."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from mcp.shared.uri_template import UriTemplate

from mcp_durable.uris import CALL_TEMPLATE, record_uri

TEMPLATE = UriTemplate.parse(CALL_TEMPLATE)


@given(st.text(min_size=1), st.text(min_size=1))
def test_record_uri_is_the_templates_expansion(tool: str, key: str) -> None:
    assert record_uri(tool, key) == TEMPLATE.expand({"tool": tool, "key": key})


def test_record_uri_encodes_reserved_characters() -> None:
    assert record_uri("ship", "a/b c?é") == "journal://calls/ship/a%2Fb%20c%3F%C3%A9"
