"""mcp-durable: an MCP server and library in which a tool's `idempotentHint` is enforced.

from mcp_durable import DurableServer, ToolPolicy, current_call

server = DurableServer("payments")

@server.tool(durable=ToolPolicy(key_fields=("order_id",)))
def refund(order_id: str, amount_cents: int) -> dict[str, object]:
    return provider.refund(order_id, amount_cents, idempotency_key=current_call().key)
"""

from typing import TYPE_CHECKING

from .engine import CallOutcome, Engine, ToolOutcome
from .errors import (
    ArgumentsTooDeepError,
    CallCancelledError,
    CallNotFoundError,
    ClientRequestWithoutKeyError,
    ConfigError,
    DeterminismError,
    DurableError,
    FencedOutError,
    ForbiddenError,
    InDoubtError,
    InProgressError,
    InvalidKeyError,
    JournalCorruptError,
    JournalError,
    JournalLockedError,
    KeyReuseError,
    LimitExceededError,
    MissingKeyError,
    NonFiniteArgumentError,
    NotSerialisableError,
    OperatorError,
    OutcomeUnknownError,
    TaskCancelledError,
    TooLargeError,
    UpstreamUnavailableError,
)
from .journal import CallIdentity, CallRecord, CallState, Journal, JournalEntry, create_journal
from .keys import KEY_META
from .policy import NOT_APPLIED, ToolPolicy
from .steps import DurableCall, current_call, current_key
from .version import __version__ as __version__

if TYPE_CHECKING:  # the class for type checkers; at run time it is loaded on first use (below)
    from .server import DurableServer


def __getattr__(name: str) -> object:
    # The MCP face imports the whole SDK; loading it only when asked keeps the operator CLI and
    # journal-only users (workers on the process journal) fast to start.
    if name == "DurableServer":
        from .server import DurableServer

        return DurableServer
    raise AttributeError(f"module 'mcp_durable' has no attribute {name!r}")


__all__ = [
    "KEY_META",
    "NOT_APPLIED",
    "ArgumentsTooDeepError",
    "CallCancelledError",
    "CallIdentity",
    "CallNotFoundError",
    "CallOutcome",
    "CallRecord",
    "CallState",
    "ConfigError",
    "DeterminismError",
    "DurableCall",
    "DurableError",
    "DurableServer",
    "Engine",
    "FencedOutError",
    "ForbiddenError",
    "InDoubtError",
    "InProgressError",
    "InvalidKeyError",
    "Journal",
    "JournalCorruptError",
    "JournalEntry",
    "JournalError",
    "JournalLockedError",
    "KeyReuseError",
    "LimitExceededError",
    "MissingKeyError",
    "ClientRequestWithoutKeyError",
    "NonFiniteArgumentError",
    "NotSerialisableError",
    "OperatorError",
    "OutcomeUnknownError",
    "TaskCancelledError",
    "TooLargeError",
    "ToolOutcome",
    "ToolPolicy",
    "UpstreamUnavailableError",
    "create_journal",
    "current_call",
    "current_key",
]
