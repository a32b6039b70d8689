"""The refund worker example, killed for real: position is recovered, duplicates only in the danger window.

Runs `examples/refund_worker.py` trials end to end (real worker processes that SIGKILL
themselves at a chosen step and phase, then a worker that resumes): one trial per crash phase
and variant, at random steps. The full 50-trial table is `python examples/refund_worker.py trials`.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("refund_worker_example", ROOT / "examples" / "refund_worker.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("key", [False, True], ids=["without-key", "with-key"])
def test_every_killed_worker_resumes_and_duplicates_happen_exactly_in_the_danger_window_without_a_key(
    tmp_path: Path, key: bool
) -> None:
    example = load_example()
    rng = random.Random()
    plan = [(i, phase, rng.randrange(example.ORDERS)) for i, phase in enumerate(example.PHASES)]
    with ThreadPoolExecutor(max_workers=len(plan)) as pool:
        trials = list(pool.map(lambda p: example.run_trial(tmp_path, p[0], key, p[2], p[1]), plan))
    assert all(t.killed for t in trials)
    assert all(t.resumed for t in trials)
    [row] = [r for r in example.summarize(trials) if r["trials"]]
    assert row["danger_window_crashes"] == 1
    if key:
        assert row["trials_with_duplicates"] == 0
    else:
        assert [t.duplicates > 0 for t in trials] == [t.danger for t in trials]
        assert row["trials_with_duplicates"] == row["danger_window_crashes"]
