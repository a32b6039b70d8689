"""The journal resources' URIs, in one module (no `mcp` import: the operator CLI prints them too).

`record_uri` is RFC 6570 simple expansion of `journal://calls/{tool}/{key}`: every character
outside the unreserved set (`A-Z a-z 0-9 - . _ ~`) is percent-encoded as UTF-8, so a key `a/b`
is `a%2Fb`. That is what the SDK's `UriTemplate.expand` gives (a test holds the two equal),
without importing the SDK.
"""

from __future__ import annotations

from urllib.parse import quote

STATS_URI = "journal://stats"
RECOVERY_URI = "journal://recovery"
IN_DOUBT_URI = "journal://in-doubt"
CALL_TEMPLATE = "journal://calls/{tool}/{key}"


def record_uri(tool: str, key: str) -> str:
    """The canonical `journal://calls/{tool}/{key}` URI of a record (see the module docstring)."""
    return f"journal://calls/{quote(tool, safe='')}/{quote(key, safe='')}"
