"""The power-loss harness: record a workload, cut power at many points, check every state.

1. `record`: the workload (`workload.py`) runs under strace (`strace_log.py`); every write,
   sync, create, rename, truncate and unlink under its root, and every marker it wrote, is an
   event (`recording.py`).
2. `plan_cuts`: cut points (after event `c`), all distinct, a share of them inside the windows
   where files are created, renamed or deleted (segment rotation, snapshot, compaction, restart;
   SQLite's checkpoints and WAL resets), the rest spread over the run (seeded).
3. At each cut point, crash states (`fsmodel.py`): variant 0 keeps only what was durable,
   variants 1… add a seeded sample of what was not (subsets, prefixes, torn sectors).
4. Each state is checked by a `checker.py` subprocess (killed and replaced if it hangs) and
   judged here (`judge`): the violations are the result.
"""

from __future__ import annotations

import os
import random
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from .recording import Event, events_with_states
from .strace_log import parse, run_traced

REPO = Path(__file__).resolve().parents[2]
#: The test-only switch of the journal that removes one fsync (see segments.py); set only on
#: the recorded workload, to show the harness catches the broken build.
SKIP_FSYNC_ENV = "MCP_DURABLE_TEST_SKIP_FSYNC"


@dataclass(slots=True)
class Options:
    kind: str
    cuts: int = 1000
    seed: int = 1
    calls: int = 200
    variants: int = 2  # states per cut point: durable-only, then seeded samples
    timeout: float = 60.0  # per state: longer is a hang
    skip_fsync: str | None = None  # the broken build: passed to the workload only
    synchronous: str | None = None  # SQLite: record with ?synchronous=… instead of the default FULL
    #: Check exactly the cut points this picks from (events, windows) instead (regression tests).
    select: Callable[[list[Event], list[str]], list[int]] | None = None
    restarts: int = 0  # crash states that start a second recorded run (power lost during recovery)
    restart_cuts: int = 50  # cut points in each second run
    workdir: Path | None = None


@dataclass(slots=True)
class Violation:
    cut: int
    variant: int
    kind: str
    detail: str
    event: str
    window: str
    crash_model: dict[str, str]

    def describe(self) -> str:
        return (
            f"cut {self.cut} (after event {self.event!r}, window {self.window}) variant {self.variant}: "
            f"{self.kind}: {self.detail}; crash model: {self.crash_model}"
        )


@dataclass(slots=True)
class Summary:
    kind: str
    events: int = 0
    calls_acknowledged: int = 0
    cuts: list[int] = field(default_factory=list)
    cuts_by_window: Counter[str] = field(default_factory=Counter)
    states: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    recovered_with_repairs: int = 0
    acks_checked: int = 0
    claims_checked: int = 0
    steps_checked: int = 0
    orphans_in_doubt: int = 0
    violations: list[Violation] = field(default_factory=list)
    seconds_recording: float = 0.0
    seconds_checking: float = 0.0

    def count(self, kind: str) -> int:
        return sum(1 for v in self.violations if v.kind == kind)


# -- recording -----------------------------------------------------------------------------------


def record(options: Options, workdir: Path, *, first_key: int = 0, existing: bool = False) -> tuple[Path, Path, Path]:
    """Run the workload under strace; returns (log, root, markers). `existing`: `workdir/root`
    already holds a journal (a crash state), which the workload's first boot recovers."""
    root, markers, log = workdir / "root", workdir / "markers.jsonl", workdir / "strace.log"
    root.mkdir(parents=True, exist_ok=existing)
    env = {k: v for k, v in os.environ.items() if k != SKIP_FSYNC_ENV}
    if options.skip_fsync:
        env[SKIP_FSYNC_ENV] = options.skip_fsync
    argv = [
        sys.executable,
        "-m",
        "tests.powerloss.workload",
        options.kind,
        str(root),
        str(markers),
        "--calls",
        str(options.calls if not existing else max(10, options.calls // 4)),
        "--seed",
        str(options.seed + first_key),
        "--first-key",
        str(first_key),
    ]
    if options.synchronous:
        argv += ["--synchronous", options.synchronous]
    done = run_traced(argv, log, timeout=600, env=env, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"the workload failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return log, root, markers


# -- cut points ----------------------------------------------------------------------------------


def windows(events: list[Event], kind: str) -> list[str]:
    """For each event, the window it lies in (`run` outside every named one).

    The workload's own begin/end markers name windows first; then each event that starts a
    window of the journal `kind` (`_file_window`, `_sqlite_window`) names the events around it
    that no window named yet."""
    names = ["run"] * len(events)
    _mark_workload_windows(events, names)
    starts_window = _file_window if kind == "file" else _sqlite_window
    for ev in events:
        found = starts_window(ev)
        if found is not None:
            name, until = found
            _mark_window(events, names, ev.index, name, until)
    return names


def _mark_workload_windows(events: list[Event], names: list[str]) -> None:
    """Name every event from a workload `window` marker's begin to its end (both included)."""
    open_at: dict[str, int] = {}
    for ev in events:
        m = ev.marker
        if m is not None and m.get("m") == "window":
            if m["phase"] == "begin":
                open_at[m["name"]] = ev.index
            elif m["phase"] == "end" and m["name"] in open_at:
                for i in range(open_at.pop(m["name"]), ev.index + 1):
                    names[i] = m["name"]


def _mark_window(events: list[Event], names: list[str], start: int, name: str, until: str, limit: int = 40) -> None:
    """Name `name` the events from 3 before `start` to 3 after the first one (within `limit` of
    it) whose label contains `until`, leaving those already in a window as they are."""
    stop = start
    while stop < min(len(events), start + limit) and until not in events[stop].label:
        stop += 1
    for i in range(max(0, start - 3), min(len(events), stop + 3)):
        if names[i] == "run":
            names[i] = name


def _file_window(ev: Event) -> tuple[str, str] | None:
    """The file journal's window `ev` starts, as (name, label that ends it), or None: a segment
    rotation, a snapshot, or the journal's creation (its first events)."""
    label = ev.label
    if label.startswith("create ") and "/seg-" in label and not label.endswith("seg-00000001.log"):
        return "rotation", "fsync dir"
    if label.startswith("create ") and "/snapshot-" in label:
        return "snapshot", "unlink"
    if label.startswith(("mkdir", "create")) and ev.index < 15:
        return "create", "fsync file seg"
    return None


def _sqlite_window(ev: Event) -> tuple[str, str] | None:
    """The SQLite journal's window `ev` starts, as (name, label that ends it), or None: a
    checkpoint, a WAL reset, or a file created or deleted."""
    label = ev.label
    if label.startswith("write journal.db @"):
        return "checkpoint", "fsync file journal.db"
    if label.startswith("write journal.db-wal @0+32"):
        return "wal-reset", "fsync"
    if label.startswith(("unlink", "mkdir", "create")):
        return "create-delete", "fsync"
    return None


def plan_cuts(names: list[str], cuts: int, seed: int) -> list[int]:
    """Distinct cut points `c` (power lost after event c-1): half in windows, the rest anywhere.

    The half in windows is taken one window kind at a time, in turn (seeded within each kind), so
    that a kind with few events (a snapshot's) is cut as surely as one with many (a compaction's):
    sampled from all windowed events at once, a run whose compactions happened to write more
    events than usual left the snapshot uncut."""
    candidates = list(range(1, len(names) + 1))
    if cuts >= len(candidates):
        return candidates
    rng = random.Random(seed)
    by_window: dict[str, list[int]] = {}
    for c in candidates:
        if names[c - 1] != "run":
            by_window.setdefault(names[c - 1], []).append(c)
    for group in by_window.values():
        rng.shuffle(group)
    chosen: set[int] = set()
    in_windows = cuts // 2
    while len(chosen) < in_windows and any(by_window.values()):
        for name in sorted(by_window):
            if by_window[name] and len(chosen) < in_windows:
                chosen.add(by_window[name].pop())
    rest = [c for c in candidates if c not in chosen]
    chosen.update(rng.sample(rest, cuts - len(chosen)))
    return sorted(chosen)


# -- expectations --------------------------------------------------------------------------------


@dataclass(slots=True)
class Expected:
    """What the caller had been told (or the tool had seen) before the cut."""

    acks: dict[tuple[str, str, str], list[Any]] = field(default_factory=dict)
    claims: dict[tuple[str, str, str], list[Any]] = field(default_factory=dict)
    steps: dict[tuple[str, int], list[Any]] = field(default_factory=dict)

    def add(self, marker: dict[str, Any]) -> None:
        kind = marker.get("m")
        if kind == "ack":
            ident = (marker["principal"], marker["tool"], marker["key"])
            self.acks[ident] = [*ident, marker["payload"], marker["failed"], marker["expires"], marker["at"]]
        elif kind == "claimed":
            ident = (marker["principal"], marker["tool"], marker["key"])
            self.claims[ident] = [*ident, marker["tool"] == "temp"]
            if ident in self.acks and self.acks[ident][5]:
                # Its retention ended and a repeat claimed the key afresh: the old result is gone by
                # design (the new claim, and its result once acknowledged, are what must survive).
                del self.acks[ident]
        elif kind == "step":
            self.steps[(marker["process_id"], marker["index"])] = [
                marker["process_id"],
                marker["index"],
                marker["result"],
            ]

    def copy(self) -> Expected:
        return Expected(dict(self.acks), dict(self.claims), dict(self.steps))

    def request(self, kind: str, root: Path) -> dict[str, Any]:
        return {
            "kind": kind,
            "root": str(root),
            "acks": list(self.acks.values()),
            "claims": list(self.claims.values()),
            "steps": list(self.steps.values()),
        }


# -- checking ------------------------------------------------------------------------------------


class Checker:
    """A `checker.py` subprocess; replaced when a state makes it hang or die."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.proc: subprocess.Popen[bytes] | None = None

    def _start(self) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if k != SKIP_FSYNC_ENV}
        return subprocess.Popen(
            [sys.executable, "-m", "tests.powerloss.checker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=REPO,
            env=env,
        )

    def check(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(orjson.dumps(request) + b"\n")
            proc.stdin.flush()
        except BrokenPipeError:
            self.close()
            return {"outcome": "crash", "error": "the checker died before reading the state"}
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            ready = sel.select(self.timeout)
        if not ready:
            self.close()
            return {"outcome": "hang", "error": f"no answer within {self.timeout} s"}
        line = proc.stdout.readline()
        if not line:
            code = proc.wait()
            self.proc = None
            return {"outcome": "crash", "error": f"the checker process died (exit {code})"}
        answer: dict[str, Any] = orjson.loads(line)
        return answer

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.kill()
            proc.wait()


def judge(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The violations in one checked state: (kind, detail).

    A crash or hang is the only violation reported. Otherwise: every acknowledged result, claim
    and step lost, a refusal, then (when the state holds a journal) where `journal verify`
    disagrees with recovery (a verify crash ends the list), and a refusal that does not name
    the damage."""
    outcome = report.get("outcome")
    if outcome in ("crash", "hang"):
        return [(outcome, str(report.get("error", ""))[-1500:])]
    found = _lost(report)
    if outcome == "refused":
        # A power loss damages nothing that was synced: a journal with a correct sync discipline
        # can always open what one leaves, so a refusal is a defect too (and loses every result).
        found.append(("refused", f"{report.get('error')}"))
    if not report.get("exists"):
        return found
    before = report["verify_before"]
    if "crash" in before:
        return [*found, ("crash", "journal verify crashed: " + before["crash"][-1500:])]
    if outcome == "refused" and before["exit"] == 0:
        found.append(("verify_disagrees", f"open refused ({report.get('error')}) but verify said ok"))
    if outcome == "opened":
        found += _verify_disagrees_with_recovery(report, before)
    if outcome == "refused" and not any(word in str(report.get("error")) for word in ("journal", "corrupt")):
        found.append(("unclear_refusal", str(report.get("error"))))  # a refusal must name the damage
    return found


def _lost(report: dict[str, Any]) -> list[tuple[str, str]]:
    """A violation for each acknowledged result, durable claim and durable step the checker
    found lost, in that order, then one for each count or listing that disagrees with the
    records after recovery."""
    found: list[tuple[str, str]] = []
    for tool, key, why in report.get("lost_acks", []):
        found.append(("lost_ack", f"{tool}/{key}: {why}"))
    for tool, key in report.get("lost_claims", []):
        found.append(("lost_claim", f"{tool}/{key}: a durable claim is gone"))
    for process_id, index in report.get("lost_steps", []):
        found.append(("lost_step", f"{process_id} step {index}"))
    for why in report.get("kept_off", []):
        found.append(("kept_counts", why))
    return found


def _verify_disagrees_with_recovery(report: dict[str, Any], before: dict[str, Any]) -> list[tuple[str, str]]:
    """For a journal that opened: where `journal verify`, before and after the boot, disagrees
    with what recovery repaired (damage already copied aside by a recovery is explained)."""
    found: list[tuple[str, str]] = []
    repaired = bool(report.get("problems"))
    if repaired and before["exit"] == 0:
        found.append(("verify_disagrees", f"recovery repaired {report['problems']} but verify said ok"))
    unexplained = _unexplained(before["problems"], report.get("kept_aside_before", []))
    if not repaired and unexplained:
        found.append(("verify_disagrees", f"verify found {unexplained} but recovery found nothing"))
    after = report.get("verify_after", {})
    still = _unexplained(after.get("problems", []), report.get("kept_aside_after", []))
    if after.get("exit") != 0 and (still or not after.get("problems")):
        found.append(("verify_disagrees", f"after recovery verify still finds {still or after}"))
    return found


def _unexplained(problems: list[dict[str, Any]], kept_aside: list[str]) -> list[dict[str, Any]]:
    """Verify's problems but the damaged ranges a recovery already reported and copied aside.

    Recovery resynchronises past a damaged range (here: unsynced writes that reached the disk out
    of order) and keeps every valid frame after it, so the range stays in its segment until a
    compaction rewrites it; `journal verify` reports it at every run, recovery once (later opens
    start from a snapshot beyond it), leaving `<segment>.damaged-<offset>` as the record.
    """
    return [p for p in problems if f"{Path(p['path']).name}.damaged-{p['offset']}" not in kept_aside]


def run(options: Options, progress: Any = None) -> Summary:
    """Record, cut, check; returns the summary (violations included).

    With `options.restarts`, some crash states (half of them ones recovery had to repair) are
    also the start of a second recorded run: the next boot recovers them (cutting torn tails,
    deleting orphans, marking orphaned claims in doubt) and goes on working, and that run is cut
    too — power lost again during or after recovery — with everything acknowledged before the
    first cut still expected.
    """
    summary = Summary(options.kind)
    base = options.workdir or Path(tempfile.mkdtemp(prefix=f"powerloss-{options.kind}-"))
    states_dir = Path(tempfile.mkdtemp(prefix="states-", dir=_fast_tmp()))
    checker = Checker(options.timeout)
    try:
        began = time.perf_counter()
        log, root, markers = record(options, base / "recording")
        summary.seconds_recording = time.perf_counter() - began
        began = time.perf_counter()
        starts = _check_recording(
            options, summary, checker, states_dir, log, root, markers, Expected(), generation=1, progress=progress
        )
        recording_again = 0.0
        for i, (start, expected) in enumerate(starts):
            workdir = base / f"restart-{i}"
            workdir.mkdir()
            shutil.copytree(start, workdir / "root")
            shutil.copytree(start, workdir / "start")  # kept with the recording (debugging)
            began_recording = time.perf_counter()
            log2, root2, markers2 = record(options, workdir, first_key=100_000 * (i + 1), existing=True)
            recording_again += time.perf_counter() - began_recording
            _check_recording(
                options,
                summary,
                checker,
                states_dir,
                log2,
                root2,
                markers2,
                expected,
                generation=2,
                progress=progress,
                initial=start,
            )
        summary.seconds_checking = time.perf_counter() - began - recording_again
        summary.seconds_recording += recording_again
    finally:
        checker.close()
        shutil.rmtree(states_dir, ignore_errors=True)
        if options.workdir is None:
            shutil.rmtree(base, ignore_errors=True)
    return summary


def _check_recording(
    options: Options,
    summary: Summary,
    checker: Checker,
    states_dir: Path,
    log: Path,
    root: Path,
    markers: Path,
    expected: Expected,
    *,
    generation: int,
    progress: Any,
    initial: Path | None = None,
) -> list[tuple[Path, Expected]]:
    """Cut one recording and check its states; returns the starts kept for a second generation.

    `initial`: the crash state a second generation's recording started from (its durable start)."""
    existing = initial is not None
    # The events are listed once to plan the cuts, then replayed with the model.
    events = [ev for ev, _ in events_with_states(parse(log), root, markers, initial=initial)]
    names = windows(events, options.kind)
    if existing:  # from the start until the first call runs: the next boot's recovery
        first_call = next((ev.index for ev in events if ev.marker and ev.marker.get("m") == "claimed"), len(events))
        names[:first_call] = ["recovery"] * first_call
        cuts = plan_cuts(names, options.restart_cuts, options.seed + generation)
    elif options.select is not None:
        cuts = sorted(set(options.select(events, names)))
    else:
        cuts = plan_cuts(names, options.cuts, options.seed)
    summary.events += len(events)
    summary.cuts.extend(cuts)
    wanted = set(cuts)
    spacing = max(1, len(cuts) // max(1, options.restarts))
    starts: list[tuple[Path, Expected]] = []
    repaired_starts = 0
    for ev, model in events_with_states(parse(log), root, markers, initial=initial):
        if ev.marker is not None:
            expected.add(ev.marker)
        cut = ev.index + 1
        if cut not in wanted:
            continue
        window = names[ev.index] if generation == 1 else f"after restart: {names[ev.index]}"
        summary.cuts_by_window[window] += 1
        for variant in range(options.variants):
            seed = f"{options.seed}/{generation}/{cut}/{variant}"
            state = states_dir / f"g{generation}c{cut}v{variant}"
            crash_model = model.crash_state(state, None if variant == 0 else random.Random(seed))
            report = checker.check(expected.request(options.kind, state))
            summary.states += 1
            summary.outcomes[str(report.get("outcome"))] += 1
            summary.recovered_with_repairs += bool(report.get("problems"))
            summary.orphans_in_doubt += int(report.get("orphans_in_doubt", 0) or 0)
            if report.get("outcome") == "opened":
                summary.acks_checked += len(expected.acks)
                summary.claims_checked += len(expected.claims)
                summary.steps_checked += len(expected.steps)
            found = judge(report)
            for kind, detail in found:
                summary.violations.append(Violation(cut, variant, kind, detail, ev.label, window, crash_model))
            shutil.rmtree(state, ignore_errors=True)
            shutil.rmtree(state.with_name(state.name + "-verify"), ignore_errors=True)
            # Keep this state as the start of a second generation? (Rebuilt: the check changed it.)
            if generation == 1 and not found and len(starts) < options.restarts:
                repaired = bool(report.get("problems")) and repaired_starts < options.restarts // 2
                if repaired or (variant == 0 and cuts.index(cut) % spacing == 0):
                    repaired_starts += repaired
                    start = states_dir / f"start-{len(starts)}"
                    model.crash_state(start, None if variant == 0 else random.Random(seed))
                    starts.append((start, expected.copy()))
        if progress is not None:
            progress(summary)
    summary.calls_acknowledged += len(expected.acks)
    return starts


def _fast_tmp() -> str | None:
    """/dev/shm when writable (states are written and deleted thousands of times), else the default."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
