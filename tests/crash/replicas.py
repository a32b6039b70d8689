"""Several `mcp-durable serve --transport http` replicas of one journal, started at once.

Two `serve_http` blocks in one `async with` boot one server after the other: the second
process starts only once the first listens. Replicas of one journal need no such order (a
Postgres schema is migrated under an advisory lock, so replicas starting at once apply it
once; a shared SQLite journal creates its schema in one transaction under SQLite's write
lock), so `serve_http_together` starts every process first and then waits for each: their
boots, most of a crash test's time, overlap on the machine's cores. What the tests then do
with the replicas is unchanged: every one listens before the block's body runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from tests.helpers import ServedHttp, _start_cli, _stop, free_port, wait_listening

#: One replica: the target to serve, its journal URL and the environment it adds.
Replica = tuple[str, str, Mapping[str, str]]


@asynccontextmanager
async def serve_http_together(*replicas: Replica) -> AsyncIterator[list[ServedHttp]]:
    """Run `mcp-durable serve TARGET --journal JOURNAL --transport http` for each replica on a free
    port, all processes started before any is waited for; yield them, in order, once every one
    listens; stop them all (SIGTERM to every one, then reap each) when the block exits."""
    served: list[ServedHttp] = []
    try:
        for target, journal, env in replicas:
            served.append(_start_cli(["serve", target, "--journal", journal], free_port(), env))
        for index, (target, journal, env) in enumerate(replicas):
            for _attempt in range(5):
                if await wait_listening(served[index]):
                    break
                text = served[index].stderr()
                if "address already in use" not in text.lower():
                    raise RuntimeError(f"mcp-durable serve exited with {served[index].proc.returncode}:\n{text}")
                _stop(served[index])  # lost its port to a race: start it again on another
                served[index] = _start_cli(["serve", target, "--journal", journal], free_port(), env)
            else:
                raise RuntimeError("could not find a free port for mcp-durable serve")
        yield served
    finally:
        for one in served:
            if one.proc.poll() is None:
                one.proc.terminate()  # every replica shuts down at the same time …
        for one in served:
            _stop(one)  # … and is then reaped (killed if it does not exit)
