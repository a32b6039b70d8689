"""The journal resources' URIs and templates, in one module (no `mcp` import: the operator CLI
and the console print them too).

Every `journal://…` string of the package comes from here: the resources register these
templates, change notifications carry `record_uri` and `STATS_URI`, the proxy keeps `SCHEME` for
itself. `record_uri` and `process_uri` are RFC 6570 simple expansion of their templates: every
character outside the unreserved set (`A-Z a-z 0-9 - . _ ~`) is percent-encoded as UTF-8, so a
key `a/b` is `a%2Fb`. That is what the SDK's `UriTemplate.expand` gives (a test holds the two
equal), without importing the SDK.
"""

from __future__ import annotations

from urllib.parse import quote

#: Every journal resource's URI starts with this (the proxy serves these itself).
SCHEME = "journal://"

STATS_URI = "journal://stats"
RECOVERY_URI = "journal://recovery"
IN_DOUBT_URI = "journal://in-doubt"
ENTRIES_URI = "journal://entries"

#: Records newest first, filtered and paged by the query.
CALLS_TEMPLATE = "journal://calls{?tool,state,limit,cursor}"
#: One record of the caller's own.
CALL_TEMPLATE = "journal://calls/{tool}/{key}"
#: One record of another principal's, for admins.
CALL_OF_PRINCIPAL_TEMPLATE = "journal://calls/{tool}/{key}{?principal}"
#: The process-log tail after a sequence number.
ENTRIES_TEMPLATE = "journal://entries{?after,limit}"
#: One process's state as replay rebuilds it.
PROCESS_TEMPLATE = "journal://processes/{process_id}"


def record_uri(tool: str, key: str) -> str:
    """The canonical `journal://calls/{tool}/{key}` URI of a record (see the module docstring)."""
    return f"journal://calls/{quote(tool, safe='')}/{quote(key, safe='')}"


def process_uri(process_id: str) -> str:
    """The canonical `journal://processes/{process_id}` URI of a process (see the module docstring)."""
    return f"journal://processes/{quote(process_id, safe='')}"
