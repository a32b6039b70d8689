"""Where the power-loss harness cuts (`plan_cuts`): every kind of window the run went through is
cut, however few events it wrote, so the short run's assertion that it cut a snapshot, a rotation
and a compaction holds for every recording, not for most."""

from __future__ import annotations

from .harness import plan_cuts


def test_every_window_kind_is_cut_even_one_of_three_events_beside_hundreds() -> None:
    names = ["run"] * 200 + ["compaction"] * 300 + ["snapshot"] * 3 + ["rotation"] * 20 + ["run"] * 100
    for seed in range(200):
        cuts = plan_cuts(names, 60, seed)
        assert len(cuts) == len(set(cuts)) == 60
        assert {"snapshot", "rotation", "compaction"} <= {names[c - 1] for c in cuts}, seed
        assert sum(names[c - 1] != "run" for c in cuts) >= 30  # half of them in windows


def test_the_plan_is_seeded_and_takes_every_event_when_asked_for_as_many() -> None:
    names = ["run"] * 50 + ["snapshot"] * 5 + ["run"] * 50
    assert plan_cuts(names, 20, 7) == plan_cuts(names, 20, 7)
    assert plan_cuts(names, 500, 7) == list(range(1, len(names) + 1))
