"""The one exception tree of mcp-durable.

```
DurableError                 base: `except mcp_durable.DurableError` catches all we raise
├── ConfigError              bad journal URL, policy or option: a programmer's error, never a refusal
├── MissingKeyError          .tool                      (code missing_key)
│   └── ClientRequestWithoutKeyError .tool: asked its client without a caller key (code missing_key)
├── InvalidKeyError          .tool .reason              (code invalid_key)
├── KeyReuseError            .tool .key                 (code key_reuse: same key, other arguments)
├── InProgressError          .tool .key .retry_after    (code in_progress)
├── InDoubtError             .tool .key .attempts       (code in_doubt)
├── NonFiniteArgumentError   .tool .argument            (code non_finite_argument: NaN, ±Infinity, 1e400)
├── ArgumentsTooDeepError    .tool .limit               (code arguments_too_deep: nesting over the limit)
├── DeterminismError         .step_index .expected .got (a durable step differs from the journal)
├── OperatorError            an operator action that does not apply (not in doubt, …) (code operator_error)
│   └── CallNotFoundError    .tool .key: no such call, or one the asker may not see (code not_found)
├── UpstreamUnavailableError .upstream: the proxy's upstream server cannot be reached (code upstream_unavailable)
├── OutcomeUnknownError      .reason: a run whose effect may or may not have happened (the call is left in doubt)
├── ForbiddenError           .principal: an admin tool called by a principal that is not an admin (code forbidden)
├── LimitExceededError       .what .size .limit: what a durable call would journal is refused
│   ├── TooLargeError        over max_argument_bytes / max_result_bytes (code too_large)
│   └── NotSerialisableError not JSON the journal can store (code not_serialisable)
├── TaskCancelledError       .tool .key: the task's requestor cancelled it while its tool ran (code cancelled)
├── CallCancelledError       .tool .key: an operator cancelled the call; it is never resumed (code cancelled)
├── FencedOutError           .tool .key .why: raised in a run that lost its record (lease ran out, taken over)
└── JournalError             storage failed; the driver's exception is __cause__ (code journal_unavailable)
    ├── JournalLockedError   .holder: another writer holds the journal
    └── JournalCorruptError  .path .offset: what could not be read, and where
```

Every refusal the MCP face sends carries `code` as `error` in the result's
`_meta["mcp-durable/error"]` (and as `structuredContent` where the tool's output schema allows
it); the mapping lives here (`DurableError.code`) so the face turns any of these into a result
in one place (`server/results.py::refusal`), into a JSON-RPC error in one
(`server/results.py::refusal_error`), and the console into an HTTP status by one table
(`wire_errors.py`: each code's HTTP status and JSON-RPC code). A subclass added later needs
nothing more than its `code` (and `details()` for extra machine-readable fields), and a row in
that table for a new code.

`ConfigError` shares the root so that `except DurableError` still catches everything we raise,
but it is no refusal: it is raised where a server is built (a policy, a journal URL, an option)
and, should one surface while serving, it is raised again to the server's log instead of being
answered on the wire (`wire_errors.wire_of`).
"""

from __future__ import annotations


class DurableError(Exception):
    """Base of every error mcp-durable raises.

    A subclass passes its machine-readable fields to `__init__` by name: each becomes an
    attribute of the error (declared on the class, for typing) and an entry of `details()`, so
    a field is named once. Fields that are not for the wire are set as plain attributes."""

    code: str = "internal"

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.message = message
        self._details = details
        for name, value in details.items():
            setattr(self, name, value)

    def details(self) -> dict[str, object]:
        """Machine-readable fields sent beside the code (never secrets)."""
        return dict(self._details)


class ConfigError(DurableError):
    """A journal URL, a policy or a server option is wrong."""

    code = "config_error"


class _OfTool(DurableError):
    """An error about a call of one tool (`.tool`)."""

    tool: str


class _OfCall(_OfTool):
    """An error about one call (`.tool`, `.key`)."""

    key: str


class MissingKeyError(_OfTool):
    """The tool requires a caller key (`key="required"`) and the call had none (HTTP 400 analogue)."""

    code = "missing_key"

    def __init__(self, tool: str) -> None:
        message = f"tool {tool!r} requires an idempotency key: send it in _meta['mcp-durable/idempotency-key']"
        super().__init__(message, tool=tool)


class ClientRequestWithoutKeyError(MissingKeyError):
    """A durable call without a caller key asked its client (elicitation, sampling, roots, or a
    2026-07-28 `input_required` answer) while its tool ran: refused (`missing_key`) and released.

    Its key came from its arguments (derived, `key_fields`, `key_fn`), which do not say who
    answers: journaled, the answer one session gave would be replayed to another session's call
    with the same arguments, without asking it."""

    def __init__(self, tool: str) -> None:
        message = (
            f"tool {tool!r} asks its client (elicitation, sampling) while it runs, and this call has no "
            "idempotency key of its caller: its answer would be replayed to other sessions. Send a key in "
            "_meta['mcp-durable/idempotency-key'], or register the tool with ToolPolicy(interactive=True)"
        )
        _OfTool.__init__(self, message, tool=tool)  # MissingKeyError's own message is the plain one


class InvalidKeyError(_OfTool):
    """The key is not 1–255 printable ASCII characters (or not a string at all)."""

    code = "invalid_key"
    reason: str

    def __init__(self, tool: str, reason: str) -> None:
        super().__init__(f"invalid idempotency key for tool {tool!r}: {reason}", tool=tool, reason=reason)


class KeyReuseError(_OfCall):
    """The key was used before with other arguments (HTTP 422 analogue); the tool did not run."""

    code = "key_reuse"

    def __init__(self, tool: str, key: str) -> None:
        super().__init__(
            f"idempotency key {key!r} of tool {tool!r} was already used with different arguments; "
            "use a new key for a new operation",
            tool=tool,
            key=key,
        )


class InProgressError(_OfCall):
    """A call with this key is still running and did not finish within the wait (HTTP 409 analogue)."""

    code = "in_progress"
    retry_after: float

    def __init__(self, tool: str, key: str, retry_after: float) -> None:
        message = f"a call of tool {tool!r} with key {key!r} is still in progress; retry after {retry_after:.1f}s"
        super().__init__(message, tool=tool, key=key, retry_after=retry_after)


class InDoubtError(_OfCall):
    """The previous attempt died inside the danger window and policy forbids running it again."""

    code = "in_doubt"
    attempts: int

    def __init__(self, tool: str, key: str, attempts: int, reason: str = "") -> None:
        why = f" ({reason})" if reason else ""
        super().__init__(
            f"call of tool {tool!r} with key {key!r} is in doubt after {attempts} attempt(s){why}: "
            "its side effect may or may not have happened; an operator must resolve it "
            "(mcp-durable journal resolve)",
            tool=tool,
            key=key,
            attempts=attempts,
        )


class NonFiniteArgumentError(_OfTool):
    """A durable call's argument is NaN, Infinity or -Infinity (or a number beyond a 64-bit float,
    like `1e400`, read as infinite). Refused before any claim: JSON has no such numbers, so the
    journal would record `null` and the fingerprint would equal a call that sent `null`."""

    code = "non_finite_argument"
    argument: str

    def __init__(self, tool: str, argument: str) -> None:
        why = "it cannot be fingerprinted or journaled; send a finite number"
        message = (
            f"argument {argument} of tool {tool!r} is not a finite number (NaN, Infinity, or too large "
            f"for a 64-bit float): {why}"
        )
        super().__init__(message, tool=tool, argument=argument)


class ArgumentsTooDeepError(_OfTool):
    """A durable call's arguments nest objects and arrays deeper than the server's limit
    (`max_argument_depth`). Refused before any claim."""

    code = "arguments_too_deep"
    limit: int

    def __init__(self, tool: str, limit: int) -> None:
        super().__init__(
            f"the arguments of tool {tool!r} nest objects and arrays more than {limit} levels deep "
            f"(the arguments object is level 1); the limit is {limit} (max_argument_depth)",
            tool=tool,
            limit=limit,
        )


class DeterminismError(DurableError):
    """A durable step's name differs from the journal's step at the same position."""

    code = "determinism_error"

    def __init__(self, step_index: int, expected: str, got: str) -> None:
        super().__init__(
            f"durable step {step_index} is {got!r} but the journal recorded {expected!r}: "
            "a tool's steps must run in the same order on every attempt"
        )
        self.step_index, self.expected, self.got = step_index, expected, got


class TaskCancelledError(_OfCall):
    """The call is an MCP task that its requestor cancelled (`tasks/cancel`) while its tool ran."""

    code = "cancelled"

    def __init__(self, tool: str, key: str) -> None:
        super().__init__(f"task call of tool {tool!r} with key {key!r} was cancelled", tool=tool, key=key)


class CallCancelledError(_OfCall):
    """An operator cancelled the call (`journal cancel`, `journal_cancel`): its tool was stopped, or
    will not run; a repeat of its key is refused until the record expires or is forgotten."""

    code = "cancelled"

    def __init__(self, tool: str, key: str) -> None:
        message = f"call of tool {tool!r} with key {key!r} was cancelled by an operator"
        super().__init__(message, tool=tool, key=key)


class FencedOutError(_OfCall):
    """Raised inside a run that no longer holds its record (its lease ran out and another owner
    took it over, or it timed out): it begins no new durable step, and nothing it writes is kept.
    Its caller is answered with the recorded outcome, never this run's."""

    code = "in_progress"

    def __init__(self, tool: str, key: str, why: str) -> None:
        message = f"call of tool {tool!r} with key {key!r} no longer runs here ({why}): another owner has it"
        super().__init__(message, tool=tool, key=key)
        self.why = why


class OperatorError(DurableError):
    """An operator action (resolve, purge) that does not apply to the journal's state."""

    code = "operator_error"


class CallNotFoundError(OperatorError):
    """There is no call `tool`/`key` (or it expired), or there is one the asker may not see: another
    principal's record is answered exactly like a missing one."""

    code = "not_found"
    tool: str
    key: str

    def __init__(self, tool: str, key: str) -> None:
        super().__init__(f"no call {tool}/{key}", tool=tool, key=key)


class UpstreamUnavailableError(DurableError):
    """The proxy's upstream server cannot be reached: the call was not sent and nothing was journaled."""

    code = "upstream_unavailable"

    upstream: str

    def __init__(self, upstream: str, reason: str) -> None:
        message = f"upstream {upstream} cannot be reached: {reason}; nothing was journaled, retry later"
        super().__init__(message, upstream=upstream)


class OutcomeUnknownError(DurableError):
    """Raised by a run whose effect may or may not have happened (an upstream died mid-call).

    The engine does not release the claim (a retry could repeat the effect): it marks the call
    IN_DOUBT, and the tool's in-doubt policy decides what a repeat does.
    """

    code = "in_doubt"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class JournalError(DurableError):
    """The journal could not store or read; the driver's exception is `__cause__`."""

    code = "journal_unavailable"


class JournalLockedError(JournalError):
    """Another writer process holds the journal."""

    def __init__(self, path: str, holder: str) -> None:
        super().__init__(f"journal {path} is locked by another writer ({holder})")
        self.path = path
        self.holder = holder


class JournalCorruptError(JournalError):
    """Bytes of the journal could not be read as records."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"journal {path} is corrupt at offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class ForbiddenError(DurableError):
    """An operator (admin) tool was called by a principal that is not a journal admin."""

    code = "forbidden"

    principal: str

    def __init__(self, principal: str) -> None:
        super().__init__(f"principal {principal!r} is not a journal admin", principal=principal)


class LimitExceededError(DurableError):
    """What a durable call would journal (its arguments or its result) is refused.

    `what` is `arguments` or `result`; `size` and `limit` are bytes of JSON where a size limit
    was the reason. Arguments are refused before any claim (a corrected retry with the same
    key runs); a result after the run, when its claim is released (see `mcp_durable.limits`).
    """

    def __init__(self, message: str, *, what: str, size: int | None = None, limit: int | None = None) -> None:
        super().__init__(message)
        self.what = what
        self.size = size
        self.limit = limit

    def details(self) -> dict[str, object]:
        found: dict[str, object] = {"what": self.what}
        if self.size is not None:
            found["size_bytes"] = self.size
        if self.limit is not None:
            found["limit_bytes"] = self.limit
        return found


class TooLargeError(LimitExceededError):
    """The arguments or the result are over the configured size limit."""

    code = "too_large"


class NotSerialisableError(LimitExceededError):
    """The arguments or the result cannot be written as JSON, so they could never be replayed."""

    code = "not_serialisable"
