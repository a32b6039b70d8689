"""The MCP face: `DurableServer` and the mapping of engine answers to MCP results."""

from .app import DurableServer
from .assembly import default_principal
from .results import META_FIRST_COMPLETED, META_KEY, META_REPLAYED

__all__ = ["DurableServer", "META_FIRST_COMPLETED", "META_KEY", "META_REPLAYED", "default_principal"]
