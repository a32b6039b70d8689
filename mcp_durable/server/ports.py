"""What the server's helper modules see of a `DurableServer`, as structural types.

`DurableServer.__init__` (server/app.py) builds the journal resources, the change notifications,
the MCP tasks and the operator and lookup tools, and registers each of them on itself. The
helpers receive only this narrow face of the server, never the server: so none of them imports
`server/app.py` (which imports them), and none can reach for more than it is given.

- `DurableHost`: the engine (and through it the journal), the tool policies, and who is asking.
  `DurableServer` satisfies it structurally.
- `ScopedSubscriptionBus`: a subscription bus that can also carry events scoped to a principal
  across processes (`PgSubscriptionBus` of server/pgbus.py is one); the notifier forwards record
  changes through it.
- `ToolSpec`: a tool a helper defines and the server registers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context
from mcp.server.subscriptions import ServerEvent, SubscriptionBus
from mcp_types import ToolAnnotations

if TYPE_CHECKING:
    from ..engine import Engine
    from ..policy import ToolPolicy


class DurableHost(Protocol):
    """The server as its helpers use it. Every member is read when used, never copied: a tool
    registered after a helper was built is seen by it."""

    @property
    def engine(self) -> Engine:
        """The engine; its `journal` is the journal served (it may change before the start)."""
        ...

    @property
    def policies(self) -> Mapping[str, ToolPolicy]:
        """The durable tools' policies by tool name (kept up to date by `add_tool`)."""
        ...

    def principal_of(self, context: Context[Any, Any] | None, /) -> str:
        """The principal of a tool call's context (None: no request; see `default_principal`)."""
        ...

    def request_principal(self, request: ServerRequestContext[Any, Any] | None) -> str:
        """The principal of the low-level request being served (None: no request)."""
        ...

    def is_admin(self, principal: str) -> bool:
        """Whether `principal` sees every principal's records and may operate on them."""
        ...


@runtime_checkable
class ScopedSubscriptionBus(SubscriptionBus, Protocol):
    """A `SubscriptionBus` that also carries events scoped to a principal between processes.

    A record's change may reach only its principal and admins, so it cannot be `publish`ed to
    every listener of another replica; these two methods carry it with its principal instead.
    """

    def forward(self, event: ServerEvent, *, principal: str | None = None) -> None:
        """Send `event` to the other processes only (the caller delivers locally its own way),
        scoped to `principal` if given. Synchronous and never yields (it runs inside the engine's
        change listener); best effort: never raises for a delivery problem."""
        ...

    def subscribe_scoped(self, listener: Callable[[ServerEvent, str], None]) -> Callable[[], None]:
        """Register `listener(event, principal)` for other processes' scoped events; returns an
        idempotent unsubscribe callable. Plain `subscribe` listeners never see scoped events."""
        ...


class ToolSpec(NamedTuple):
    """A tool defined by a helper, for `DurableServer` to register (`add_tool`)."""

    fn: Callable[..., Any]
    name: str
    annotations: ToolAnnotations
