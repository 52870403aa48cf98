"""The plan benchmark's repeated runs: the row shown is the run of median wall time."""

from __future__ import annotations

from benchmarks.plan import RUNS_COLUMN, _median_run


def test_the_median_run_is_shown_with_every_wall_time() -> None:
    runs = [
        {"wall s": 3.9, "solve s": 1.2},
        {"wall s": 2.4, "solve s": 0.2},
        {"wall s": 3.1, "solve s": 0.9},
    ]
    row = _median_run(runs)
    assert row["solve s"] == 0.9
    assert row[RUNS_COLUMN] == "3.9/2.4/3.1"


def test_an_even_count_takes_the_slower_middle_run_and_errors_do_not_count() -> None:
    runs = [{"wall s": 2.0}, {"status": "error: boom"}, {"wall s": 4.0}, {"wall s": 3.0}, {"wall s": 1.0}]
    assert _median_run(runs)["wall s"] == 3.0
    assert _median_run([{"wall s": 5.0}]) == {"wall s": 5.0}
    assert _median_run([{"status": "error: boom"}])["status"] == "error: boom"
