"""Masking secrets wherever a journal URL (or a message quoting one) is shown. Pure, no `mcp` import.

`display_url` is the one function every place that prints or logs a journal URL goes through:
the serve banner, the warning when the journal is unavailable at start, `mcp-durable journal`
output and error messages. It masks

- the password of a URL's user info: `postgresql://user:secret@host/db` → `user:***@host`;
- the value of every secret parameter, in a URL's query or a libpq `key=value` string:
  `password`, `sslpassword`, `passwd`, `pwd`, and any name containing `password`, `secret`,
  `token` or `api_key`/`apikey`: `?password=secret` → `?password=***`.

It takes any text, not only a bare URL, so a driver's message that quotes a connection string
is masked the same way.
"""

from __future__ import annotations

import re

MASK = "***"

#: `scheme://user:password@`: the password is everything between the first `:` of the user info
#: and the last `@` before the host (a password may hold `@`; the host part never does).
_USERINFO = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@\s]*):(?P<secret>[^/?#\s]*)@(?=[^@/?#\s]*(?:[/?#\s]|$))"
)
#: `name=value` where the name says it is a secret; the value ends at `&`, `;`, `#` or space.
_PARAMETER = re.compile(
    r"(?P<head>(?<![A-Za-z0-9_.-])(?:[A-Za-z0-9_.-]*(?:password|passwd|secret|token|api_?key)[A-Za-z0-9_.-]*|pwd)=)"
    r"(?P<secret>'(?:[^'\\]|\\.)*'|[^&;#\s]*)",
    re.IGNORECASE,
)


def display_url(text: str) -> str:
    """`text` (a URL, or a message that quotes one) safe to print or log: every secret masked."""
    masked = _USERINFO.sub(lambda m: f"{m['head']}:{MASK}@", text)
    return _PARAMETER.sub(lambda m: f"{m['head']}{MASK}" if m["secret"] else m[0], masked)
