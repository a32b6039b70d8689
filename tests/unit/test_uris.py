"""`uris.record_uri` and `uris.process_uri` (no SDK import) expand like the SDK's RFC 6570 `UriTemplate`."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from mcp.shared.uri_template import UriTemplate

from mcp_durable import uris
from mcp_durable.uris import CALL_TEMPLATE, PROCESS_TEMPLATE, process_uri, record_uri

TEMPLATE = UriTemplate.parse(CALL_TEMPLATE)
PACKAGE_DIR = Path(uris.__file__).parent


@given(st.text(min_size=1), st.text(min_size=1))
def test_record_uri_is_the_templates_expansion(tool: str, key: str) -> None:
    assert record_uri(tool, key) == TEMPLATE.expand({"tool": tool, "key": key})


@given(st.text(min_size=1))
def test_process_uri_is_the_templates_expansion(process_id: str) -> None:
    assert process_uri(process_id) == UriTemplate.parse(PROCESS_TEMPLATE).expand({"process_id": process_id})


def test_record_uri_encodes_reserved_characters() -> None:
    assert record_uri("ship", "a/b c?é") == "journal://calls/ship/a%2Fb%20c%3F%C3%A9"


def test_every_journal_uri_in_code_comes_from_uris() -> None:
    """Only uris.py spells a `journal://` or `durable://` URI in code; docstrings and comments may
    name them (they are read, not served)."""
    literal = re.compile(r"""["'](?:journal|durable)://""")
    found = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        if path.name == "uris.py" and path.parent == PACKAGE_DIR:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if literal.search(code) and not code.lstrip().startswith(('"""', "`")):
                found.append(f"{path.relative_to(PACKAGE_DIR)}:{number}: {line.strip()}")
    assert found == [], "URI literals outside uris.py:\n" + "\n".join(found)
