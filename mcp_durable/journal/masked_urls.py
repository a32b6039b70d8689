"""Masking secrets wherever a URL (or a message quoting one) is shown. Pure, no `mcp` import.

`display_url` is the one function every place that prints or logs a journal URL or the proxy's
upstream URL goes through: the serve and proxy banners, the warning when the journal is
unavailable at start, `mcp-durable journal` output, the proxy's `upstream_unavailable` messages
and its log lines (the HTTP client's included), and error messages. It masks

- the password of a URL's user info: `postgresql://user:secret@host/db` → `user:***@host`; with
  `user_info=True` the whole user info (`https://***@host/mcp`), for URLs whose user name may
  itself be a credential (an upstream's `https://TOKEN@host/…`);
- the value of every secret parameter, in a URL's query or a libpq `key=value` string:
  `password`, `sslpassword`, `passwd`, `pwd`, `key`, `sig`, and any name containing `password`,
  `secret`, `token`, `auth`, `credential`, `signature` or `api_key`/`apikey`/`api-key`, or ending
  in `_key`/`-key`/`.key` (`access_key`, `x-api-key`): `?password=secret` → `?password=***`.

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
#: `scheme://anything@`: the whole user info, up to the last `@` before the host.
_WHOLE_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<secret>[^/?#\s]+)@(?=[^@/?#\s]*(?:[/?#\s]|$))")
#: `name=value` where the name says it is a secret; the value ends at `&`, `;`, `#` or space.
_PARAMETER = re.compile(
    r"(?P<head>(?<![A-Za-z0-9_.-])"
    r"(?:[A-Za-z0-9_.-]*(?:password|passwd|secret|token|auth|credential|signature|api[_-]?key)[A-Za-z0-9_.-]*"
    r"|(?:[A-Za-z0-9_.-]*[_.-])?key|pwd|sig)=)"
    r"(?P<secret>'(?:[^'\\]|\\.)*'|[^&;#\s]*)",
    re.IGNORECASE,
)


def display_url(text: str, *, user_info: bool = False) -> str:
    """`text` (a URL, or a message that quotes one) safe to print or log: every secret masked.

    `user_info=True` masks a URL's whole user info, the user name with the password."""
    if user_info:
        masked = _WHOLE_USERINFO.sub(lambda m: f"{m['head']}{MASK}@", text)
    else:
        masked = _USERINFO.sub(lambda m: f"{m['head']}:{MASK}@", text)
    return _PARAMETER.sub(lambda m: f"{m['head']}{MASK}" if m["secret"] else m[0], masked)
