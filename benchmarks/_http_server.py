"""The server side of case 5: `python -m benchmarks._http_server plain|durable|console [JOURNAL_URL]`.

`console` is the durable server with the operator console mounted at /console, as `mcp-durable
serve --transport http` mounts it, and nobody looking at it.

Serves the no-op tool over streamable HTTP with uvicorn on 127.0.0.1, on a port the kernel
picks; prints `PORT <n>` on stdout once the socket is bound and listening, then serves until
killed.
"""

from __future__ import annotations

import socket
import sys

import anyio
import uvicorn

from mcp_durable.cli.commands import freeze_startup_heap

from .servers import durable_server, plain_server


def main() -> None:
    kind = sys.argv[1]
    server = plain_server() if kind == "plain" else durable_server(sys.argv[2])
    app = server.streamable_http_app(streamable_http_path="/mcp")
    if kind == "console":
        from mcp_durable.console import mount_console

        mount_console(app, server)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    # Deployed as `mcp-durable serve` runs a server: the start-up heap frozen once it is built
    # (both servers alike, so the comparison stays plain against durable).
    freeze_startup_heap()
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
    anyio.run(uvicorn.Server(config).serve, [sock])


if __name__ == "__main__":
    main()
