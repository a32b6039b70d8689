"""Case 14: FastMCP side by side — plain, made durable in process, and fastmcp-tasks, one run.

Every system is a FastMCP server with the same no-op tool (`_fastmcp_server.py`) in a process of
its own, reached over the same transport by the same client: the MCP Python SDK's `Client` over
stdio in the 2026-07-28 era (the only era fastmcp-tasks serves tasks in; over streamable HTTP the
SDK 2.3 client of that era waits ~40 ms per call whatever the server does, case 5's note).

- **FastMCP** (plain): the baseline.
- **FastMCP + mcp-durable** (`make_durable`, in process), on the file journal (the default) and
  SQLite: `noop` keyed by its arguments, so a new `n` is a miss (claim, run, result durable) and
  the same `n` a replay (answered from the journal).
- **FastMCP + mcp-durable tasks**: the same server with `noop` a task-required tool
  (`task=TaskConfig(mode="required")`): task creation (a new key: the claim with its task id
  durable before the answer) and `tasks/get` of a finished task.
- **fastmcp-tasks** (its `TasksExtension`, Docket on Redis), a task-required `noop`: task creation
  and `tasks/get`, on a Redis of our own with AOF `appendfsync always` (every write synced, as our
  journals sync) and on one with Redis's defaults (no AOF). fastmcp-tasks serves no plain call
  differently from FastMCP and deduplicates nothing, so it has no miss or replay of its own.
- **DurableServer tasks** (mcp-durable without FastMCP), for reference.

fastmcp-tasks 4.1.4 (the newest release) pins fastmcp-slim 4.1.4, so it cannot be installed beside
the FastMCP 4.2 the `fastmcp` extra pins (and `fastmcp[tasks]` 4.1.6 pins a fastmcp-tasks release
the registry does not have). It runs from a virtual environment of its own, `TASKS_VENV`
(`$MCP_DURABLE_BENCH_FASTMCP_TASKS_VENV`, default /tmp/fmt-venv), which a full run creates when it
is missing with `SETUP` (a quick run does not, and reports the rows as not set up).

Latency in interleaved rounds (a new seeded order each round, 5 requests per cell), medians; then
misses per second at 64 concurrent callers on one connection (medians of the repetitions). Target:
the FastMCP integration's task creation and `tasks/get` ahead of fastmcp-tasks on the Redis that
syncs every write.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp_types import CallToolResult, Request, Result
from pydantic import ConfigDict, TypeAdapter

from .common import CaseResult, Settings, Table, Target, median, rate, ratio, us
from .servers import TOOL
from .throughput import _burst
from .timing import BenchmarkError, check_result

CALLERS = 64
ROOT = Path(__file__).resolve().parent.parent
SERVER_SCRIPT = Path(__file__).resolve().with_name("_fastmcp_server.py")
TASKS_RELEASE = "4.1.4"
TASKS_VENV = Path(os.environ.get("MCP_DURABLE_BENCH_FASTMCP_TASKS_VENV", "/tmp/fmt-venv"))
#: How the full run creates fastmcp-tasks' environment when it is missing (and how to by hand).
SETUP = f"python3 -m venv {TASKS_VENV} && {TASKS_VENV}/bin/pip install 'fastmcp-tasks=={TASKS_RELEASE}'"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
_ANY = TypeAdapter(dict[str, Any])


class TaskHandle(Result):
    """A 2026-07-28 `CreateTaskResult` (the task's fields beside `resultType: "task"`)."""

    model_config = ConfigDict(extra="allow")

    result_type: Literal["task"] = "task"
    task_id: str
    status: str


async def _resolve(handle: TaskHandle, ctx: ClaimContext) -> CallToolResult:
    """The task's result, polled until it is terminal (for `Client.call_tool`; the case itself
    calls with `allow_claimed=True` and measures the creation)."""
    with anyio.fail_after(60):
        while True:
            task: dict[str, Any] = await ctx.session.send_request(  # type: ignore[type-var]  # a raw dict
                Request[Any, Any](method="tasks/get", params={"taskId": handle.task_id}), _ANY
            )
            if task["status"] == "completed":
                return CallToolResult.model_validate(task["result"], by_name=False)
            if task["status"] != "working":
                raise BenchmarkError(f"task {handle.task_id} ended {task['status']}")
            await anyio.sleep(0.02)


class TasksClient(ClientExtension):
    """The client's side of the tasks extension: declares it, and takes a task as the answer."""

    identifier = TASKS_EXTENSION

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return (ResultClaim(result_type="task", model=TaskHandle, resolve=_resolve),)


@dataclass
class System:
    """One server measured: how it is started, which requests apply to it, what it gave."""

    name: str
    command: str
    args: list[str]
    calls: bool  # plain tools/call: miss, replay, misses/s
    tasks: bool  # task creation, tasks/get
    samples: dict[str, list[float]] = field(default_factory=dict)
    rates: list[float] = field(default_factory=list)
    failure: str | None = None

    def median(self, kind: str) -> float:
        return median(self.samples.get(kind, []))


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _tasks_python(settings: Settings) -> tuple[str | None, str]:
    """fastmcp-tasks' Python and its versions, or None and why not (a full run sets it up)."""
    python = TASKS_VENV / "bin" / "python"
    probe = (
        "import importlib.metadata as m, fastmcp_tasks; print(m.version('fastmcp-tasks'), m.version('fastmcp-slim'))"
    )

    def versions() -> str | None:
        if not python.exists():
            return None
        done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60)
        return done.stdout.strip() if done.returncode == 0 else None

    found = versions()
    if found is None and not settings.quick:
        log = settings.workdir / "fastmcp-tasks-setup.log"
        with log.open("w") as out:
            subprocess.run(SETUP, shell=True, stdout=out, stderr=subprocess.STDOUT, timeout=900)
        found = versions()
        if found is None:
            return None, f"`{SETUP}` failed: {log.read_text()[-300:]}"
    if found is None:
        return None, f"not set up (a full run creates it: `{SETUP}`)"
    tasks, slim = found.split()
    return str(python), f"fastmcp-tasks {tasks} on FastMCP {slim}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextmanager
def _redis(sync_every_write: bool) -> Iterator[str]:
    """A redis-server of our own in a temp dir on a free port (never the machine's shared one):
    AOF with `appendfsync always` when `sync_every_write`, else Redis's defaults (no AOF, RDB
    snapshots). Yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed")
    directory = tempfile.mkdtemp(prefix="bench-docket-")
    port = _free_port()
    persistence = ["--appendonly", "yes", "--appendfsync", "always", "--save", ""] if sync_every_write else []
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", directory, *persistence],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not _pong(port):
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"redis-server on port {port} did not start")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(directory, ignore_errors=True)


def _systems(settings: Settings, tasks_python: str | None, redis: dict[str, str]) -> list[System]:
    here = sys.executable
    journal = settings.workdir / f"fastmcp-{uuid.uuid4().hex[:8]}"
    journal.mkdir(parents=True)

    def ours(kind: str, store: str) -> list[str]:
        return [str(SERVER_SCRIPT), kind, store]

    systems = [
        System("FastMCP", here, [str(SERVER_SCRIPT), "plain"], calls=True, tasks=False),
        System("FastMCP + mcp-durable, file (the default)", here, ours("durable", f"file://{journal}/f"), True, False),
        System("FastMCP + mcp-durable, sqlite", here, ours("durable", f"sqlite:///{journal}/s.db"), True, False),
        System("FastMCP + mcp-durable tasks, file", here, ours("durable-tasks", f"file://{journal}/t"), False, True),
    ]
    if tasks_python is not None:
        for label, url in redis.items():
            args = [str(SERVER_SCRIPT), "fastmcp-tasks", url]
            systems.append(System(f"fastmcp-tasks, Docket on Redis ({label})", tasks_python, args, False, True))
    systems.append(
        System("DurableServer tasks, file (no FastMCP)", here, ours("server-tasks", f"file://{journal}/d"), False, True)
    )
    return systems


async def _tasks_get(client: Client, task_id: str) -> dict[str, Any]:
    result: dict[str, Any] = await client.session.send_request(  # type: ignore[type-var]  # a raw dict
        Request[Any, Any](method="tasks/get", params={"taskId": task_id}), _ANY
    )
    return result


async def _create(client: Client, n: int) -> TaskHandle:
    handle = await client.session.call_tool(TOOL, {"n": n}, allow_claimed=True)
    if not isinstance(handle, TaskHandle) or handle.status not in ("working", "completed"):
        raise BenchmarkError(f"a task-creating call did not answer with a task: {handle!r}")
    return handle


async def _finished_task(client: Client, n: int) -> str:
    """A task created now and polled until it completed; its id."""
    task_id = (await _create(client, n)).task_id
    with anyio.fail_after(60):
        while (await _tasks_get(client, task_id))["status"] == "working":
            await anyio.sleep(0.02)
    return task_id


#: One measured cell: the system, the kind of request, and one request of it.
Cell = tuple[System, str, Callable[[], Awaitable[Any]]]


async def _cells(system: System, client: Client, fresh: Iterator[int]) -> list[Cell]:
    """The system's cells, each path warmed up (and its replayed call and finished task made)."""
    cells: list[Cell] = []
    if system.calls:
        journaled = True if "mcp-durable" in system.name else None  # plain FastMCP: no replay `_meta`

        async def miss() -> None:
            check_result(
                await client.call_tool(TOOL, {"n": next(fresh)}), replayed=None if journaled is None else False
            )

        async def replay() -> None:
            check_result(await client.call_tool(TOOL, {"n": 0}), replayed=journaled)

        check_result(await client.call_tool(TOOL, {"n": 0}), replayed=None if journaled is None else False)
        cells += [(system, "miss", miss), (system, "replay", replay)]
    if system.tasks:
        done = await _finished_task(client, next(fresh))

        async def create() -> None:
            await _create(client, next(fresh))

        async def get() -> None:
            if (await _tasks_get(client, done))["status"] != "completed":
                raise BenchmarkError("tasks/get of a finished task did not answer it completed")

        cells += [(system, "create", create), (system, "get", get)]
    for _, _, request in cells:
        for _ in range(5):
            await request()
    return cells


async def _measure(settings: Settings, systems: list[System]) -> None:
    rounds = settings.pick(2, 40)
    per_round = 5
    total = settings.pick(64, 1000)
    reps = settings.pick(1, 3)
    fresh = itertools.count(1 + random.randrange(10**9) * 1000)
    async with AsyncExitStack() as stack:
        cells: list[Cell] = []
        clients: dict[str, Client] = {}
        for system in systems:
            params = StdioServerParameters(command=system.command, args=system.args, cwd=str(ROOT))
            extensions = [TasksClient()] if system.tasks else []
            try:
                client = await stack.enter_async_context(Client(params, mode="auto", extensions=extensions))
                cells += await _cells(system, client, fresh)
            except Exception as exc:  # noqa: BLE001 - a system that fails is reported, not fatal
                system.failure = f"{type(exc).__name__}: {exc}"[:200]
                continue
            clients[system.name] = client
        live = [cell for cell in cells if cell[0].failure is None]
        for round_number in range(rounds):
            order = list(live)
            random.Random(round_number).shuffle(order)
            for system, kind, request in order:
                samples = system.samples.setdefault(kind, [])
                for _ in range(per_round):
                    began = time.perf_counter()
                    await request()
                    samples.append(time.perf_counter() - began)
        for _ in range(reps):
            for system in systems:
                if not system.calls or system.name not in clients:
                    continue
                call = clients[system.name].call_tool
                system.rates.append(await _burst(call, lambda: {"n": next(fresh)}, CALLERS, total))


async def run(settings: Settings) -> CaseResult:
    result = CaseResult("fastmcp")
    table = Table(
        "14. FastMCP side by side: plain, + mcp-durable in process, fastmcp-tasks (stdio, 2026-07-28, median)",
        ["system", "miss", "replay", f"misses/s at {CALLERS}", "miss / plain", "task creation", "tasks/get"],
    )
    result.tables.append(table)
    if _version("fastmcp") == "not installed":
        table.add("FastMCP is not installed: pip install -e '.[fastmcp]'", "", "", "", "", "", "")
        return result
    tasks_python, tasks_note = _tasks_python(settings)
    with ExitStack() as stack:
        redis: dict[str, str] = {}
        if tasks_python is not None:
            redis["AOF, appendfsync always"] = stack.enter_context(_redis(sync_every_write=True))
            redis["Redis defaults: no AOF"] = stack.enter_context(_redis(sync_every_write=False))
        systems = _systems(settings, tasks_python, redis)
        await _measure(settings, systems)
    plain = systems[0]
    for system in systems:
        if system.failure is not None:
            table.add(system.name, "failed", "", "", "", "", system.failure)
            continue
        table.add(
            system.name,
            us(system.median("miss")) if system.calls else "–",
            us(system.median("replay")) if system.calls else "–",
            rate(median(system.rates)) if system.rates else "–",
            ratio(system.median("miss") / plain.median("miss")) if system.calls else "–",
            us(system.median("create")) if system.tasks else "–",
            us(system.median("get")) if system.tasks else "–",
        )
    if tasks_python is None:
        table.add(f"fastmcp-tasks {TASKS_RELEASE}", "", "", "", "", "", tasks_note)
    where = (
        f"{tasks_note} in {TASKS_VENV}" if tasks_python is not None else f"fastmcp-tasks {TASKS_RELEASE}: {tasks_note}"
    )
    table.notes.append(
        f"FastMCP {_version('fastmcp')} (plain and with mcp-durable); {where} (it pins "
        f"fastmcp-slim {TASKS_RELEASE}: it cannot be installed beside FastMCP 4.2). Each server is a process of "
        "its own over stdio, called by the MCP Python SDK's client (2026-07-28; the task systems' client declares "
        "io.modelcontextprotocol/tasks). Latency: interleaved rounds of 5 requests per cell in a new order each "
        "round; misses/s: 64 concurrent callers on one connection. A miss is a new key; a replay repeats one; "
        "for plain FastMCP both are the same call (nothing is journaled). Task creation: a new key, every tool "
        "task-required; tasks/get: a finished task. fastmcp-tasks creates a new task for every call, whatever its "
        "arguments (no deduplication): its figures are for creation only."
    )
    result.targets.extend(_targets(systems))
    return result


def _targets(systems: list[System]) -> list[Target]:
    by_name = {s.name: s for s in systems}
    ours = by_name.get("FastMCP + mcp-durable tasks, file")
    rival = next((s for s in systems if "appendfsync always" in s.name), None)
    name = "FastMCP + mcp-durable tasks ahead of fastmcp-tasks (Redis appendfsync always) on creation and tasks/get"
    if rival is None:
        return [Target(name, "> 1.00x on each", "not measured: fastmcp-tasks is not set up", None)]
    failure = (ours.failure if ours is not None else "not measured") or rival.failure
    if ours is None or failure is not None:
        return [Target(name, "> 1.00x on each", f"not measured: {failure}", None)]
    create = rival.median("create") / ours.median("create")
    get = rival.median("get") / ours.median("get")
    measured = f"theirs/ours: creation {ratio(create)}, tasks/get {ratio(get)}"
    return [Target(name, "> 1.00x on each", measured, create > 1 and get > 1)]
