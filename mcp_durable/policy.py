"""Per-tool durability policy: key mode, waits, leases, errors, in-doubt handling, retention. Pure.

A `ToolPolicy` is what a tool is registered with (`@server.tool(durable=ToolPolicy(...))`, or
`durable=True` for the defaults). The engine reads it; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import ConfigError

KeyMode = Literal["auto", "derived", "required"]
InDoubtPolicy = Literal["retry", "reconcile", "refuse"]
ErrorHandling = Literal["persist", "release"]
TaskSupport = Literal["forbidden", "optional", "required"]

DEFAULT_RETENTION = 24 * 3600.0
#: How long a run may last unless its policy says otherwise (`ToolPolicy.timeout`).
DEFAULT_TIMEOUT = 600.0


@dataclass(frozen=True, slots=True)
class NotApplied:
    """What a reconcile hook returns when the downstream system shows the effect did not happen."""


NOT_APPLIED = NotApplied()

#: A reconcile hook: given the key and the validated arguments, inspect the downstream system and
#: return the tool's result (the effect happened) or `NOT_APPLIED` (it did not; the call runs).
#: It runs with `current_call()` set to the in-doubt call (use `current_call().scoped_key` to
#: find what the tool passed downstream). Raising means "cannot tell": the call stays in doubt
#: and is refused (`in_doubt`) until a later attempt's hook can answer or an operator resolves it.
ReconcileHook = Callable[[str, Mapping[str, Any]], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """How one durable tool is keyed, waited on, leased, retried and retained.

    - `key`: `"auto"` (the caller's key, else the key argument, fields or function; a call with
      none of them runs unjournaled), `"derived"` (as `auto`, and else derived from the whole
      argument object: every later call with equal arguments is the same effect and is answered
      from the journal until the record's `retention` ends) or `"required"` (a call without a
      caller key is refused with `missing_key`). A key derived from all arguments is never the
      default: a later, legitimate call with the same arguments (delete, create, delete) would
      get the first call's answer.
    - `idempotent`: the tool is registered idempotent: it advertises `idempotentHint: true`, and
      a crash in the danger window is retried by default. A call of it without a key runs
      unjournaled: re-running an idempotent tool is safe by its own contract.
    - `key_argument` / `key_fields` / `key_fn`: the tool's own key sources, in that order.
    - `wait`: how long a duplicate in flight waits for the first call (seconds) before it gets
      `in_progress` with `retry_after`.
    - `lease`: seconds a running call's claim is valid without a heartbeat; the owner renews it
      every `lease / 3` seconds while the tool runs. An owner whose lease runs out (a stall, a
      partition from the journal) stops its run at its next await and writes nothing more.
    - `timeout`: seconds a run may last (default `DEFAULT_TIMEOUT`, 10 minutes; None: no
      bound). Past it the engine stops renewing, cancels the run and marks the call IN_DOUBT
      (reason `timed_out`): its outcome is unknown, and the in-doubt policy decides what a
      repeat does. Bounds a hung tool, which would otherwise pin its key for as long as it hangs.
    - `tool_errors`: a tool's deliberate error result (`ToolError`) is `"persist"`ed and
      replayed (default) or `"release"`d so a retry runs again.
    - `exceptions`: an unexpected exception is `"release"`d (default: the retry runs again) or
      `"persist"`ed as a failed result.
    - `in_doubt`: `"retry"`, `"reconcile"` or `"refuse"`; default `retry` when idempotent,
      else `refuse`. `reconcile` needs a `reconcile` hook.
    - `max_attempts`: after this many attempts an in-doubt call is parked for an operator.
    - `retention`: seconds a completed or failed record is kept (`None` = forever).
    - `sensitive`: argument names masked in resources and CLI output (`"*result*"` masks the result).
    - `fingerprint_fields` / `fingerprint_exclude`: the arguments the fingerprint (and a key
      derived from all arguments) is made of: only the named ones, or all but the named ones
      (e.g. a free-text `reason` an agent rewords on a retry). At most one of the two.
    - `key_meta`: more `_meta` names a caller's key is read from, in order, after our own
      `mcp-durable/idempotency-key` (e.g. `("idempotency_key",)`, the agentic-commerce binding's).
    - `interactive`: the tool asks its user (elicitation) or a model (sampling) while it runs, so
      its arguments are not its whole input: its key comes only from the caller (`_meta` or
      `key_argument`), never derived, and a call without one runs undeduplicated (or is refused
      with `missing_key` under `key="required"`). Derived keys would replay one session's
      answers to another session.
    - `task_support`: whether the tool runs as an MCP task (docs/tasks.md): `"forbidden"` (the
      default: the tool behaves exactly as a plain durable tool), `"optional"` or `"required"`.
      Advertised as `execution.taskSupport` (2025-11-25).
    - `task_after`: on 2026-07-28, a call of a task-capable tool from a client that declares the
      tasks extension answers with a task once it has run this long (seconds) without finishing.
    """

    key: KeyMode = "auto"
    idempotent: bool = True
    key_argument: str | None = None
    key_fields: tuple[str, ...] | None = None
    key_fn: Callable[[dict[str, Any]], str] | None = None
    wait: float = 30.0
    lease: float = 30.0
    timeout: float | None = DEFAULT_TIMEOUT
    tool_errors: ErrorHandling = "persist"
    exceptions: ErrorHandling = "release"
    in_doubt: InDoubtPolicy | None = None
    reconcile: ReconcileHook | None = None
    max_attempts: int = 5
    retention: float | None = DEFAULT_RETENTION
    sensitive: tuple[str, ...] = field(default=())
    fingerprint_fields: tuple[str, ...] | None = None
    fingerprint_exclude: tuple[str, ...] = field(default=())
    key_meta: tuple[str, ...] = field(default=())
    interactive: bool = False
    task_support: TaskSupport = "forbidden"
    task_after: float = 1.0

    def __post_init__(self) -> None:
        """Validate every field, raising `ConfigError` on the first one that is wrong (in this
        order), and normalise the name sequences to tuples (a bare string is one name)."""
        self._check_key_mode_and_durations()
        self._check_error_handling()
        self._check_key_sources()
        self._normalise_bare_names()
        self._check_counts_and_retention()
        self._check_in_doubt()
        self._check_task_fields()
        self._normalise_name_tuples()
        self._check_fingerprint_and_key_sources()

    def _check_key_mode_and_durations(self) -> None:
        """`key` is a known mode; `wait`, `lease` and `timeout` are usable durations."""
        if self.key not in ("auto", "derived", "required"):
            raise ConfigError(f"key must be 'auto', 'derived' or 'required', not {self.key!r}")
        if not (self.wait >= 0 and self.lease > 0):  # written so NaN fails too
            raise ConfigError("wait must be >= 0 and lease > 0 seconds")
        if self.timeout is not None and not self.timeout > 0:
            raise ConfigError("timeout must be positive seconds, or None for runs without a bound")

    def _check_error_handling(self) -> None:
        """`tool_errors` and `exceptions` are each "persist" or "release"."""
        if self.tool_errors not in ("persist", "release") or self.exceptions not in ("persist", "release"):
            raise ConfigError(
                f"tool_errors and exceptions must be 'persist' or 'release', "
                f"not {self.tool_errors!r} / {self.exceptions!r}"
            )

    def _check_key_sources(self) -> None:
        """`key_argument` is a non-empty name; `key_fn` and `reconcile` are callables when given."""
        if self.key_argument is not None and (not isinstance(self.key_argument, str) or not self.key_argument):
            raise ConfigError(f"key_argument must be an argument name, not {self.key_argument!r}")
        if (self.key_fn is not None and not callable(self.key_fn)) or (
            self.reconcile is not None and not callable(self.reconcile)
        ):
            raise ConfigError("key_fn and reconcile must be callables")

    def _normalise_bare_names(self) -> None:
        """A bare string in `key_fields` or `sensitive` is one field name, not a sequence of
        one-letter fields."""
        if isinstance(self.key_fields, str):
            object.__setattr__(self, "key_fields", (self.key_fields,))
        if isinstance(self.sensitive, str):
            object.__setattr__(self, "sensitive", (self.sensitive,))

    def _check_counts_and_retention(self) -> None:
        """`key_fields` names at least one argument (or is None); `max_attempts` is at least 1;
        `retention` is positive (or None)."""
        if self.key_fields is not None and not self.key_fields:
            raise ConfigError("key_fields must name at least one argument (or be None)")
        if self.max_attempts < 1:
            raise ConfigError("max_attempts must be at least 1")
        if self.retention is not None and self.retention <= 0:
            raise ConfigError("retention must be positive seconds, or None to keep records forever")

    def _check_in_doubt(self) -> None:
        """`in_doubt` is a known policy (or None), and "reconcile" comes with its hook."""
        if self.in_doubt not in (None, "retry", "reconcile", "refuse"):
            raise ConfigError(f"in_doubt must be 'retry', 'reconcile' or 'refuse', not {self.in_doubt!r}")
        if self.in_doubt == "reconcile" and self.reconcile is None:
            raise ConfigError("in_doubt='reconcile' needs a reconcile hook")

    def _check_task_fields(self) -> None:
        """`task_support` is a known level; `task_after` is >= 0 seconds (NaN fails)."""
        if self.task_support not in ("forbidden", "optional", "required"):
            raise ConfigError(f"task_support must be 'forbidden', 'optional' or 'required', not {self.task_support!r}")
        if not self.task_after >= 0:
            raise ConfigError("task_after must be >= 0 seconds")

    def _normalise_name_tuples(self) -> None:
        """`key_fields` (when given) and `sensitive` become tuples, whatever sequence was passed."""
        if self.key_fields is not None and not isinstance(self.key_fields, tuple):
            object.__setattr__(self, "key_fields", tuple(self.key_fields))
        if not isinstance(self.sensitive, tuple):
            object.__setattr__(self, "sensitive", tuple(self.sensitive))

    def _check_fingerprint_and_key_sources(self) -> None:
        for name in ("fingerprint_fields", "fingerprint_exclude", "key_meta"):
            value = getattr(self, name)
            if isinstance(value, str):  # a bare string is one name
                value = (value,)
            if value is not None:
                value = tuple(value)
                if not all(isinstance(item, str) and item for item in value):
                    raise ConfigError(f"{name} must be a sequence of names, not {getattr(self, name)!r}")
            object.__setattr__(self, name, value)
        if self.fingerprint_fields is not None and self.fingerprint_exclude:
            raise ConfigError("give fingerprint_fields or fingerprint_exclude, not both")
        if self.fingerprint_fields is not None and not self.fingerprint_fields:
            raise ConfigError("fingerprint_fields must name at least one argument (or be None)")
        if self.interactive and (self.key_fields is not None or self.key_fn is not None or self.key == "derived"):
            raise ConfigError(
                "an interactive tool cannot derive its key (key_fields, key_fn, key='derived'): its input includes the "
                "answers it elicits, so a derived key would replay one session's answers to another; "
                "take the key from the caller (_meta or key_argument)"
            )

    def fingerprinted(self, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
        """The arguments the fingerprint is made of (`fingerprint_fields` / `fingerprint_exclude`)."""
        if self.fingerprint_fields is not None:
            return {name: value for name, value in arguments.items() if name in self.fingerprint_fields}
        if self.fingerprint_exclude:
            return {name: value for name, value in arguments.items() if name not in self.fingerprint_exclude}
        return arguments

    @property
    def fingerprints_all_arguments(self) -> bool:
        return self.fingerprint_fields is None and not self.fingerprint_exclude

    @property
    def advertised_idempotent(self) -> bool:
        """Whether the tool advertises `idempotentHint: true`: registered idempotent, and not
        interactive (an interactive call without a caller key is not deduplicated)."""
        return self.idempotent and not self.interactive

    @property
    def in_doubt_policy(self) -> InDoubtPolicy:
        """The effective in-doubt policy (the explicit one, else by `idempotent`)."""
        if self.in_doubt is not None:
            return self.in_doubt
        if self.reconcile is not None:
            return "reconcile"
        return "retry" if self.idempotent else "refuse"

    @property
    def heartbeat_interval(self) -> float:
        """How often the owner renews its lease while the tool runs."""
        return self.lease / 3.0


def as_policy(durable: ToolPolicy | bool | None) -> ToolPolicy | None:
    """Normalise the `durable=` registration argument: True means the defaults, False/None none."""
    if durable is None or durable is False:
        return None
    if durable is True:
        return ToolPolicy()
    if isinstance(durable, ToolPolicy):
        return durable
    raise ConfigError(f"durable= takes a ToolPolicy or a bool, not {type(durable).__name__}")
