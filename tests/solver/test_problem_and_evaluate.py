"""The problem model's validation and hash, and the evaluator against hand-computed examples."""

from __future__ import annotations

import math

import numpy as np
import pytest

from solver import iopddl
from solver.errors import ProblemError
from solver.evaluate import evaluate
from solver.problem import Problem
from tests.bundled_data import EXAMPLE


def example() -> Problem:
    return iopddl.load(EXAMPLE)


def test_example_optimum_is_445_and_uses_the_whole_limit() -> None:
    result = evaluate(example(), [0, 0, 2, 1, 0])
    assert result.cost == 445
    assert result.feasible
    assert result.peak_usage == 50


def test_example_cost_by_hand() -> None:
    # nodes 15 + 55 + 25 + 85 + 95 = 275; edges (0,1)=30 (0,2)=50 (1,3)=90 (2,4)=60 (3,4)=70 -> 300
    result = evaluate(example(), [0, 0, 0, 0, 0])
    assert result.cost == 575
    assert result.feasible


def test_memory_violation_reports_the_worst_time_step() -> None:
    # node 2 strategy 1 uses 20: at t in [50, 70) nodes 0, 1, 2 are alive: 10 + 25 + 20 = 55 > 50
    result = evaluate(example(), [0, 0, 1, 0, 0])
    assert not result.feasible
    assert result.peak_usage == 55
    assert result.peak_time == 50
    assert "exceeds the limit 50 at time 50" in result.violations[0]


def test_half_open_intervals_do_not_overlap_at_the_boundary() -> None:
    problem = Problem.from_lists(
        costs=[[0], [0]], usages=[[10], [10]], intervals=[[0, 5], [5, 9]], usage_limit=10
    )
    assert evaluate(problem, [0, 0]).feasible
    touching = problem.replace(intervals=np.array([[0, 6], [5, 9]]))
    assert evaluate(touching, [0, 0]).peak_usage == 20


def test_empty_interval_uses_no_memory() -> None:
    problem = Problem.from_lists(costs=[[1]], usages=[[100]], intervals=[[0, 0]], usage_limit=1)
    result = evaluate(problem, [0])
    assert result.feasible and result.peak_usage == 0


def test_forbidden_choice_is_infinite_and_infeasible() -> None:
    problem = Problem.from_lists(costs=[[1, 2], [3]], edges=[[0, 1]], edge_costs=[[1e18, 5]])
    assert math.isinf(evaluate(problem, [0, 0]).cost)
    assert not evaluate(problem, [0, 0]).feasible
    assert evaluate(problem, [1, 0]).cost == 2 + 3 + 5


def test_parallel_edges_both_count() -> None:
    problem = Problem.from_lists(costs=[[0], [0]], edges=[[0, 1], [1, 0]], edge_costs=[[4], [6]])
    assert evaluate(problem, [0, 0]).cost == 10


def test_groups_and_pins_are_checked() -> None:
    problem = Problem.from_lists(costs=[[1, 2], [1, 2]], groups=[[0, 1]], pins={0: 1})
    assert evaluate(problem, [1, 1]).feasible
    assert any("group" in v for v in evaluate(problem, [1, 0]).violations)
    assert any("pinned" in v for v in evaluate(problem, [0, 0]).violations)


@pytest.mark.parametrize(
    ("solution", "field"),
    [([0, 0, 0], "solution"), ([0, 0, 5, 0, 0], "solution[2]"), ([0, -1, 0, 0, 0], "solution[1]")],
)
def test_bad_solutions_name_the_field(solution: list[int], field: str) -> None:
    with pytest.raises(ProblemError) as error:
        evaluate(example(), solution)
    assert error.value.field == field


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"costs": [[1.0, float("nan")], [1.0]]}, "nodes.costs[0]"),
        ({"costs": [[1.0, -2.0], [1.0]]}, "nodes.costs[0]"),
        ({"usages": [[1, 2]]}, "nodes.usages"),
        ({"usages": [[1], [1]]}, "nodes.usages[0]"),
        ({"edges": [[0, 2]]}, "edges.nodes[0]"),
        ({"edges": [[0, -1]]}, "edges.nodes[0]"),
        ({"edges": [[0, 0]]}, "edges.nodes[0]"),
        ({"edge_costs": [[1.0]]}, "edges.costs[0]"),
        ({"edge_costs": [[1.0, float("nan")]]}, "edges.costs[0]"),
        ({"intervals": [[0, 1], [-1, 2]]}, "nodes.intervals[1]"),
        ({"groups": [[0, 1]]}, "groups[0]"),
        ({"pins": {1: 3}}, "pins[1]"),
        ({"costs": [[], [1.0]], "usages": [[], [1]]}, "nodes.costs"),
    ],
)
def test_bad_problems_name_the_field(changes: dict, field: str) -> None:
    arguments: dict = {
        "costs": [[1.0, 2.0], [1.0]],
        "usages": [[1, 2], [3]],
        "intervals": [[0, 1], [0, 2]],
        "edges": [[0, 1]],
        "edge_costs": [[1.0, 2.0]],
    }
    arguments.update(changes)
    with pytest.raises(ProblemError) as error:
        Problem.from_lists(**arguments)
    assert error.value.field == field


def test_content_hash_is_stable_and_ignores_the_name() -> None:
    first, second = example(), example()
    assert first.content_hash == second.content_hash
    assert first.replace(name="other").content_hash == first.content_hash
    assert first.replace(usage_limit=49).content_hash != first.content_hash
    costs = first.costs.copy()
    costs[0] += 1
    assert first.replace(costs=costs).content_hash != first.content_hash
    assert len(first.content_hash) == 64


def test_edge_matrices_laid_end_to_end_in_one_array_are_taken_without_a_copy() -> None:
    """A plan's builder writes its edges into one array (40 million costs on a 3-D mesh): the problem keeps
    that array; matrices laid out any other way are concatenated as before."""
    costs, edges = [[0.0, 1.0], [0.0, 1.0], [0.0, 1.0, 2.0]], [[0, 1], [1, 2]]
    buffer = np.arange(10, dtype=np.float64)
    laid = [buffer[0:4].reshape(2, 2), buffer[4:10].reshape(2, 3)]
    problem = Problem.from_lists(costs=costs, edges=edges, edge_costs=laid)
    assert np.shares_memory(problem.edge_costs, buffer)
    np.testing.assert_array_equal(problem.edge_costs, np.arange(10.0))
    swapped = [buffer[6:10].reshape(2, 2), buffer[0:6].reshape(2, 3)]
    apart = [buffer[0:4].reshape(2, 2), buffer[4:10].reshape(2, 3) + 0.0]
    for matrices in (swapped, apart):
        copied = Problem.from_lists(costs=costs, edges=edges, edge_costs=matrices)
        assert not np.shares_memory(copied.edge_costs, buffer)
        np.testing.assert_array_equal(copied.edge_costs, np.concatenate([m.ravel() for m in matrices]))
