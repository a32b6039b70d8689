"""Per-tool policies from a TOML file, for servers we did not write (the proxy, `serve --policies`). Pure.

    [defaults]                      # optional: applies to every durable tool below
    retention = 86400

    [tools.create_entities]
    durable = true                  # journal this tool's calls (false: pass it through untouched)
    key = "auto"                    # auto | derived | caller | fields | required   (see KEY_MODES)
    in_doubt = "refuse"             # retry | refuse
    wait = 30.0                     # seconds a duplicate in flight waits for the first call
    lease = 30.0                    # seconds a running call's claim lives without a heartbeat
    timeout = 600.0                 # seconds a run may last, or "none" (then it is in doubt)
    retention = "forever"           # seconds a result is kept, or "forever"
    task_support = "optional"       # forbidden | optional | required: served as an MCP task

    [tools.refund]
    key = "fields"
    key_fields = ["order_id"]

A tool the file does not name gets the default from the upstream's own annotations
(`default_policy`): `idempotentHint: true` makes it durable, keyed by the caller (a call
without a key runs unjournaled); anything else (`readOnlyHint: true` included) is passed through. Each entry maps onto
a `ToolPolicy`; a file that does not parse or validate raises `ConfigError` naming the file, the
line and the key.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import ConfigError
from .policy import KeyMode, ToolPolicy

#: Key modes: `auto` (the default) — the caller's `_meta` key (a call without one runs
#: unjournaled: the tool is idempotent, so a re-run is safe); `derived` — the caller's key, else
#: derived from all arguments (every later call with equal arguments is answered from the journal
#: for the record's retention: only for a tool whose equal arguments always mean one effect);
#: `caller` — as `auto`, but not registered idempotent (an in-doubt call is refused); `fields` —
#: the caller's key, else `key_fields`; `required` — a call without a caller key is refused.
KEY_MODES = ("auto", "derived", "caller", "fields", "required")


class _Entry(BaseModel):
    """One `[tools.NAME]` (or `[defaults]`) table. Unknown keys are errors: a typo must not pass."""

    model_config = ConfigDict(extra="forbid", strict=True)

    durable: bool | None = None
    key: Literal["auto", "derived", "caller", "fields", "required"] | None = None
    key_fields: list[str] | None = Field(default=None, min_length=1)
    in_doubt: Literal["retry", "refuse"] | None = None
    wait: float | None = Field(default=None, ge=0)
    lease: float | None = Field(default=None, gt=0)
    timeout: float | Literal["none"] | None = None
    retention: float | Literal["forever"] | None = None
    max_attempts: int | None = Field(default=None, ge=1)
    tool_errors: Literal["persist", "release"] | None = None
    exceptions: Literal["persist", "release"] | None = None
    sensitive: list[str] | None = None
    task_support: Literal["forbidden", "optional", "required"] | None = None
    task_after: float | None = Field(default=None, ge=0)

    @field_validator("retention")
    @classmethod
    def _positive_retention(cls, value: Any) -> Any:
        if isinstance(value, int | float) and value <= 0:
            raise ValueError('retention must be positive seconds, or "forever"')
        return value

    @field_validator("timeout")
    @classmethod
    def _positive_timeout(cls, value: Any) -> Any:
        if isinstance(value, int | float) and not value > 0:
            raise ValueError('timeout must be positive seconds, or "none"')
        return value


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    defaults: _Entry = Field(default_factory=_Entry)
    tools: dict[str, _Entry] = Field(default_factory=dict)


#: What a tool is set to: a `ToolPolicy` (durable) or `PASS_THROUGH`.
PASS_THROUGH: Literal["pass-through"] = "pass-through"
Setting = ToolPolicy | Literal["pass-through"]


@dataclass(frozen=True, slots=True)
class Policies:
    """The policies of one server: explicit settings by tool name, the rest from annotations.

    `path` is where they were read from (None: no file, annotations decide everything).
    `chosen` names, per tool, the settings the file itself gave it (its table's and
    `[defaults]`'), as opposed to a `ToolPolicy` default; None for policies built in code, where
    every setting of a listed tool counts as chosen.
    """

    tools: Mapping[str, Setting] = field(default_factory=dict)
    path: str | None = None
    chosen: Mapping[str, frozenset[str]] | None = None

    def chose(self, tool: str, setting: str) -> bool:
        """Whether the policies set `setting` for `tool` themselves (False for an unlisted tool)."""
        if tool not in self.tools:
            return False
        return self.chosen is None or setting in self.chosen.get(tool, frozenset())

    def for_tool(self, name: str, annotations: Mapping[str, Any] | None) -> ToolPolicy | None:
        """The policy of tool `name` (None: pass it through), given the upstream's annotations."""
        setting = self.tools.get(name)
        if setting is None:
            return default_policy(annotations)
        return None if setting == PASS_THROUGH else setting

    def unknown(self, names: Iterable[str]) -> list[str]:
        """Tools the file names that are not among `names` (a typo, or a tool the upstream dropped)."""
        known = set(names)
        return sorted(name for name in self.tools if name not in known)


def default_policy(annotations: Mapping[str, Any] | None) -> ToolPolicy | None:
    """Without a file: `idempotentHint: true` → durable, keyed by the caller (a call without a key
    runs unjournaled: the upstream promises a re-run is safe); else pass-through.

    `readOnlyHint: true` wins over `idempotentHint`: a read has no effect to deduplicate, and
    replaying yesterday's read would be wrong.
    """
    hints = annotations or {}
    if hints.get("readOnlyHint") is True:
        return None
    if hints.get("idempotentHint") is True:
        return ToolPolicy()
    return None


def load_policies(path: str | Path) -> Policies:
    """Read and validate a policies file; `ConfigError` names the line and key of any fault."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read policies file {source}: {exc.strerror or exc}") from exc
    return parse_policies(text, str(source))


def parse_policies(text: str, where: str = "<policies>") -> Policies:
    """Parse policies from TOML `text` (`where` names it in errors)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from exc
    try:
        parsed = _File.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        path = [str(part) for part in error["loc"]]
        path = path[: 3 if path[:1] == ["tools"] else 2]  # without union branch tags (`wait.float`)
        line = _line_of(text, path)
        at = f"{where}:{line}" if line else where
        raise ConfigError(f"{at}: {'.'.join(path)}: {error['msg']}") from None
    tools: dict[str, Setting] = {}
    chosen: dict[str, frozenset[str]] = {}
    for name, entry in parsed.tools.items():
        chosen[name] = frozenset(parsed.defaults.model_dump(exclude_none=True)) | frozenset(
            entry.model_dump(exclude_none=True)
        )
        try:
            tools[name] = _setting(parsed.defaults, entry)
        except ConfigError as exc:
            line = _line_of(text, ["tools", name])
            raise ConfigError(f"{where}:{line}: tools.{name}: {exc.message}") from None
    return Policies(tools, where, chosen)


def _setting(defaults: _Entry, entry: _Entry) -> Setting:
    merged = {**defaults.model_dump(exclude_none=True), **entry.model_dump(exclude_none=True)}
    if merged.pop("durable", True) is False:
        if entry.task_support not in (None, "forbidden"):
            # A task is a journaled call: a tool passed through has no record to be one.
            raise ConfigError(
                f'task_support = "{entry.task_support}" needs a durable tool (a task is a journaled call), '
                "not durable = false"
            )
        return PASS_THROUGH
    mode = merged.pop("key", "fields" if "key_fields" in merged else "auto")
    key_fields = merged.pop("key_fields", None)
    if mode == "fields" and not key_fields:
        raise ConfigError('key = "fields" needs key_fields = ["…"]')
    if key_fields and mode != "fields":
        raise ConfigError(f'key_fields is only used with key = "fields", not key = "{mode}"')
    retention = merged.pop("retention", None)
    timeout = merged.pop("timeout", None)
    kwargs: dict[str, Any] = dict(merged)
    if timeout is not None:
        kwargs["timeout"] = None if timeout == "none" else float(timeout)
    if retention is not None:
        kwargs["retention"] = None if retention == "forever" else float(retention)
    if key_fields:
        kwargs["key_fields"] = tuple(key_fields)
    if "sensitive" in kwargs:
        kwargs["sensitive"] = tuple(kwargs["sensitive"])
    for name in ("wait", "lease", "task_after"):
        if name in kwargs:
            kwargs[name] = float(kwargs[name])
    # `auto` and `caller`: a call without a caller key (or key fields) has no key and runs
    # unjournaled; `caller` is not registered idempotent either (an in-doubt call is refused unless
    # in_doubt says otherwise). Only `derived` makes a key of all the arguments.
    key: KeyMode = "required" if mode == "required" else "derived" if mode == "derived" else "auto"
    return ToolPolicy(key=key, idempotent=mode != "caller", **kwargs)


_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
_ASSIGN = re.compile(r"^\s*(\"[^\"]*\"|'[^']*'|[A-Za-z0-9_-]+)\s*=")


def _line_of(text: str, path: list[str]) -> int | None:
    """The 1-based line of `path` (e.g. ["tools", "refund", "wait"]) in the TOML text, best effort.

    Finds the table header (`[tools.refund]`, `[tools."refund"]`) and then, for a key inside it,
    its assignment line; falls back to the header line, then to None.
    """
    if path[:1] == ["tools"] and len(path) > 1:
        table, key = path[:2], (path[2] if len(path) > 2 else None)
    else:
        table, key = path[:1], (path[1] if len(path) > 1 else None)
    header_line: int | None = None
    seen_header = False
    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        if not header and not seen_header and len(path) == 1:
            assign = _ASSIGN.match(line)  # a stray top-level key
            if assign and assign.group(1).strip("\"'") == path[0]:
                return number
        if header:
            seen_header = True
            if header_line is not None and key is not None:
                break  # left the table without finding the key
            parts = [part.strip().strip("\"'") for part in header.group(1).split(".")]
            if parts == table:
                header_line = number
                if key is None:
                    return number
            continue
        if header_line is not None and key is not None:
            assign = _ASSIGN.match(line)
            if assign and assign.group(1).strip("\"'") == key:
                return number
    return header_line


def render_policies(tools: Iterable[tuple[str, Mapping[str, Any] | None, str | None]], policies: Policies) -> str:
    """The TOML a server would use: one table per tool `(name, annotations, description)`.

    Every tool is written out with its effective setting, ready to edit; the annotations that
    decided a default are named in a comment.
    """
    lines = [
        "# mcp-durable policies (docs/proxy.md). Generated from the upstream's tools; edit and pass",
        "# with --policies. Tools not listed here: idempotentHint → durable, anything else pass-through.",
        "",
    ]
    for name, hints_of_tool, description in tools:
        policy = policies.for_tool(name, hints_of_tool)
        given = sorted((hints_of_tool or {}).items())
        hints = ", ".join(f"{k}={str(v).lower()}" for k, v in given if k.endswith("Hint"))
        lines.append(f"[tools.{_toml_key(name)}]")
        if description:
            lines.append(f"# {description.strip().splitlines()[0][:100]}")
        source = "this file" if name in policies.tools else f"annotations: {hints or 'none'}"
        lines.append(f"# from {source}")
        if policy is None:
            lines.append("durable = false")
        else:
            lines.extend(_policy_lines(policy))
        lines.append("")
    return "\n".join(lines)


def _policy_lines(policy: ToolPolicy) -> list[str]:
    if policy.key == "required":
        mode = "required"
    elif policy.key_fields:
        mode = "fields"
    elif policy.key == "derived":
        mode = "derived"
    else:
        mode = "auto" if policy.idempotent else "caller"
    lines = ["durable = true", f'key = "{mode}"']
    if policy.key_fields:
        lines.append("key_fields = [" + ", ".join(f'"{name}"' for name in policy.key_fields) + "]")
    in_doubt = policy.in_doubt_policy if policy.in_doubt_policy != "reconcile" else "refuse"
    lines += [f'in_doubt = "{in_doubt}"', f"wait = {policy.wait}", f"lease = {policy.lease}"]
    lines.append('timeout = "none"' if policy.timeout is None else f"timeout = {policy.timeout}")
    lines.append('retention = "forever"' if policy.retention is None else f"retention = {policy.retention}")
    if policy.task_support != "forbidden":
        lines += [f'task_support = "{policy.task_support}"', f"task_after = {policy.task_after}"]
    return lines


def _toml_key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
