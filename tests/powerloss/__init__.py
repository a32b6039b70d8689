"""The power-loss harness: a recorded workload, cut at many points, each crash state checked.

strace_log.py (record and parse) → recording.py (events) → fsmodel.py (what a power cut
leaves) → checker.py (open it, read everything back) → harness.py (cut points, judging) →
`python -m tests.powerloss` (the long run) and test_powerloss.py (the short run in the suite).
See docs/crash-results.md, "Power loss".
"""
