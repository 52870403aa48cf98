"""Side by side with the contest winner: its output parsed, solutions re-evaluated, the table and its mean."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from benchmarks import iopddl_winner as winner
from solver import iopddl

EXAMPLE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "iopddl" / "example.json"
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="module")
def example():
    return iopddl.load(EXAMPLE)


def test_the_winners_last_printed_assignment_is_its_answer(example) -> None:
    # Captured: `iopddl example.json 2 -j 2` (the winner built from ti2-group/iopddl_experiments).
    output = winner.parse_winner_output((DATA / "winner_example.out").read_text())
    assert output.solution == [0, 0, 2, 1, 0]
    assert output.reported_cost == 445.0
    checked = winner.check_solution(example, output.solution)
    assert checked.feasible
    assert checked.cost == output.reported_cost


def test_a_winner_that_finds_no_plan_prints_an_empty_assignment(example) -> None:
    # Captured: the same run on the example with usage_limit 40 (below the smallest peak, 50).
    output = winner.parse_winner_output((DATA / "winner_example_over_limit.out").read_text())
    assert output.solution is None
    assert math.isinf(output.reported_cost)
    assert winner.check_solution(example, output.solution).problem == "no solution"


def test_the_evaluator_finds_the_examples_published_optimum(example) -> None:
    costs = [
        winner.check_solution(example, list(choice)).cost
        for choice in itertools.product(*(range(n) for n in example.strategy_counts.tolist()))
    ]
    assert min(c for c in costs if c is not None) == 445
    assert costs.count(None) > 0  # the memory limit rules some out


def test_a_solution_file_is_evaluated_or_rejected(example, tmp_path: Path) -> None:
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"status": "feasible", "solution": [0, 0, 0, 0, 0]}))
    bare = tmp_path / "bare.json"
    bare.write_text("[0, 0, 1, 0, 0]")
    # 15+55+25+85+95 for the nodes, 30+50+90+60+70 for the edges
    assert winner.check_solution(example, winner.read_solution_file(result)).cost == 575
    over = winner.check_solution(example, winner.read_solution_file(bare))
    assert over.cost is None
    assert over.problem.startswith("infeasible: usage 55 exceeds the limit 50")
    out_of_range = winner.check_solution(example, [0, 2, 0, 0, 0])
    assert out_of_range.cost is None and "outside 0..1" in out_of_range.problem
    assert winner.check_solution(example, [0, 0, 0]).problem.startswith("invalid:")


def test_a_row_compares_recomputed_costs_and_reports_an_infeasible_side(example) -> None:
    ours = {
        "status": "optimal",
        "solution": [0, 0, 2, 1, 0],
        "cost": 445,
        "bound": 445,
        "gap": 0.0,
        "wall": 3,
    }
    theirs = {"status": "done", "solution": [0, 0, 0, 0, 0], "wall": 2}
    row = winner.compare("ex", example, ours, theirs)
    assert (row["autoshard_cost"], row["winner_cost"]) == (445, 575)
    assert row["ratio"] == pytest.approx(445 / 575)
    assert row["notes"] == ""
    broken = winner.compare("ex", example, ours, {**theirs, "solution": [0, 0, 1, 0, 0]})
    assert broken["winner_cost"] is None and broken["ratio"] is None
    assert broken["notes"].startswith("winner (done): infeasible: usage 55")
    lying = winner.compare("ex", example, {**ours, "cost": 400}, theirs)
    assert lying["autoshard_cost"] == 445
    assert lying["notes"] == "autoshard reported 400"


def test_the_table_ends_with_the_geometric_mean_of_the_rows_with_both_costs() -> None:
    rows = [
        _row("B", 1500, 2e6, 1e6, 2.0, 9e5, 0.55, 10.4, 10.1),
        _row("G", 816, 5e5, 1e6, 0.5, 4e5, 0.2, 9.9, 10.0),
        _row("V", 900, None, 3e5, None, None, None, 10.0, 10.0, "autoshard (killed): no solution"),
        winner.missing_row("E", "not found in /data"),
    ]
    assert winner.geometric_mean(rows) == (pytest.approx(1.0), 2)
    assert winner.geometric_mean([{"ratio": 1.1}, {"ratio": 1.2}, {"ratio": 0.9}])[0] == pytest.approx(
        (1.1 * 1.2 * 0.9) ** (1 / 3)
    )
    lines = winner.table(rows).splitlines()
    assert lines[0].startswith("| instance | nodes | autoshard cost | winner cost | autoshard / winner |")
    assert lines[2] == "| B | 1,500 | 2,000,000 | 1,000,000 | 2.00000 | 900,000 | 55.00% | 10.4 | 10.1 |  |"
    assert lines[4] == "| V | 900 | - | 300,000 | - | - | - | 10.0 | 10.0 | autoshard (killed): no solution |"
    assert lines[5] == "| E | - | - | - | - | - | - | - | - | not found in /data |"
    assert lines[-1] == "geometric mean of autoshard / winner: 1.00000 over 2 of 4 instances"
    assert winner.table([winner.missing_row("E", "x")]).splitlines()[-1].endswith(": - over 0 of 1 instances")


def test_autoshard_runs_as_a_fresh_process_and_its_result_is_read_back(tmp_path: Path) -> None:
    result = winner.run_autoshard(EXAMPLE, limit=10, threads=1, workdir=tmp_path)
    assert result["status"] == "optimal"
    assert result["cost"] == 445 and result["solution"] == [0, 0, 2, 1, 0]
    assert 0 < result["seconds"] < result["wall"]


def _row(instance, nodes, ours, theirs, ratio, bound, gap, our_wall, their_wall, notes="") -> dict:
    return {
        "instance": instance,
        "nodes": nodes,
        "autoshard_cost": ours,
        "winner_cost": theirs,
        "ratio": ratio,
        "bound": bound,
        "gap": gap,
        "autoshard_wall": our_wall,
        "winner_wall": their_wall,
        "notes": notes,
    }
