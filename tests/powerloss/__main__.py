"""`python -m tests.powerloss [--journal file|sqlite|both] [--cuts 1000] [--seed 1]`: the long run.

Prints one summary row per journal (the table in docs/crash-results.md) and every violation;
exits 1 if any was found.
"""

from __future__ import annotations

import argparse
import sys
import time

from .harness import Options, Summary, run

HEADER = (
    "| journal | events recorded | cut points | states checked | by window | opened / refused | "
    "repaired at open | acks checked | claims checked | steps checked | states with a violation | lost acks | "
    "lost claims | other violations | time |"
)


def row(s: Summary) -> str:
    windows = ", ".join(f"{name} {n}" for name, n in sorted(s.cuts_by_window.items()))
    other = len(s.violations) - s.count("lost_ack") - s.count("lost_claim")
    bad = len({(v.cut, v.variant) for v in s.violations})
    return (
        f"| {s.kind} | {s.events} | {len(s.cuts)} | {s.states} | {windows} | "
        f"{s.outcomes['opened']} / {s.outcomes['refused']} | {s.recovered_with_repairs} | {s.acks_checked} | "
        f"{s.claims_checked} | {s.steps_checked} | {bad} | "
        f"**{s.count('lost_ack')}** | **{s.count('lost_claim')}** | "
        f"{other} | {s.seconds_recording + s.seconds_checking:.0f} s |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.powerloss", description=__doc__)
    parser.add_argument("--journal", choices=("file", "sqlite", "both"), default="both")
    parser.add_argument("--cuts", type=int, default=1000, help="distinct cut points per journal")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--calls", type=int, default=200, help="durable calls in the recorded workload")
    parser.add_argument("--variants", type=int, default=2, help="crash states per cut point")
    parser.add_argument(
        "--restarts",
        type=int,
        default=10,
        help="crash states that start a second recorded run, cut again (power lost during recovery)",
    )
    parser.add_argument("--restart-cuts", type=int, default=50, help="cut points in each second run")
    parser.add_argument("--skip-fsync", choices=("dir", "data"), help="record the deliberately broken build")
    parser.add_argument("--synchronous", help="SQLite: record with ?synchronous=NORMAL|OFF (default FULL)")
    args = parser.parse_args()
    kinds = ("file", "sqlite") if args.journal == "both" else (args.journal,)
    summaries = []
    for kind in kinds:
        last = [time.monotonic()]

        def progress(s: Summary, last: list[float] = last) -> None:
            if time.monotonic() - last[0] > 10:
                last[0] = time.monotonic()
                print(f"  {s.kind}: {s.states} states, {len(s.violations)} violations", file=sys.stderr)

        summaries.append(
            run(
                Options(
                    kind,
                    cuts=args.cuts,
                    seed=args.seed,
                    calls=args.calls,
                    variants=args.variants,
                    skip_fsync=args.skip_fsync,
                    synchronous=args.synchronous,
                    restarts=args.restarts,
                    restart_cuts=args.restart_cuts,
                ),
                progress,
            )
        )
    print(HEADER)
    print("|" + "---|" * (HEADER.count("|") - 1))
    for s in summaries:
        print(row(s))
    for s in summaries:
        for v in s.violations[:50]:
            print(f"{s.kind}: {v.describe()}")
        if len(s.violations) > 50:
            print(f"{s.kind}: … and {len(s.violations) - 50} more")
    return 1 if any(s.violations for s in summaries) else 0


if __name__ == "__main__":
    sys.exit(main())
