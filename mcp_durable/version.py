"""The installed distribution's version, in a module of its own so the MCP face can read it
without importing the package's `__init__` (which lazily imports the face: an import circle).
"""

from __future__ import annotations


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mcp-durable")
    except PackageNotFoundError:  # a source tree that was never installed
        return "0.0.0+unknown"


#: The installed distribution's version (what `serverInfo.version` reports by default).
__version__ = _package_version()
