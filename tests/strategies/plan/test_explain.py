"""`explain`: a node's chosen strategy, its cost split, and local alternatives; `autoshard explain`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from service.cli import app
from strategies.plan.explain import (
    UnknownTarget,
    _objective,
    explain,
    explain_text,
    find_node,
    solution_from_plan,
)
from strategies.plan.planner import PlanRequest, plan_model


@pytest.fixture(scope="module")
def outcome():
    # gap 0: the optimum (within a gap the plan may trade up to it for a smaller peak: `solver.headroom`)
    result = plan_model(PlanRequest(model="mlp", mesh="4", batch=65536, time_limit=60.0, gap=0.0))
    assert result.result.status == "optimal"
    return result


def _targets(outcome):
    built = outcome.built
    return list(built.parameter_nodes) + [n.name for n in built.nodes if n.kind == "op"]


def test_chosen_first_and_alternatives_never_better_at_the_optimum(outcome):
    built, solution = outcome.built, outcome.result.solution
    for target in _targets(outcome):
        report = explain(built, solution, target)
        index = find_node(built, target)
        first = report["ranking"][0]
        assert first["chosen"] and first["delta_s"] == 0.0 and first["strategy"] == solution[index]
        assert report["chosen"]["strategy"] == solution[index]
        deltas = [a["delta_s"] for a in report["alternatives"]]
        assert len(deltas) == min(5, report["strategy_count"] - 1)
        finite = [d for d in deltas if d != "infeasible"]
        assert all(d >= -1e-9 for d in finite), (target, deltas)
        assert finite == sorted(finite) and deltas[: len(finite)] == finite  # infeasible ones last
        chosen = report["chosen"]
        assert chosen["total_s"] == pytest.approx(
            chosen["compute_s"] + chosen["comm_in_s"] + chosen["comm_out_s"]
        )


def test_delta_is_the_change_of_the_whole_objective(outcome):
    built = outcome.built
    solution = np.asarray(outcome.result.solution)
    report = explain(built, solution, "w1.weight")
    assert report["group"] == ["w1.weight", "w1.weight.grad"]
    assert report["objective_s"] == pytest.approx(outcome.plan["solver"]["objective"])
    for alternative in report["alternatives"]:
        trial = solution.copy()
        trial[[built.parameter_nodes["w1.weight"], built.gradient_nodes["w1.weight"]]] = alternative[
            "strategy"
        ]
        moved = _objective(built, trial) - report["objective_s"]
        assert alternative["delta_s"] == pytest.approx(moved, rel=1e-9, abs=1e-12)
    # The op's cost split: compute plus the redistributions on its edges.
    op = explain(built, solution, "addmm")
    assert op["kind"] == "op" and op["chosen"]["compute_s"] > 0
    assert {e["direction"] for e in op["chosen"]["edges"]} == {"in", "out"}
    text = explain_text(op)
    assert "op addmm" in text and "next-best alternatives" in text


def test_infeasible_alternatives_are_named(outcome):
    built = outcome.built
    # the reduced bias gradient: a placement its consumers cannot take (S -> P) is named, not hidden
    report = explain(built, outcome.result.solution, "sum_1")
    assert any(a["delta_s"] == "infeasible" for a in report["alternatives"])
    assert "infeasible" in explain_text(report)
    json.dumps(report)  # JSON-ready


def test_unknown_target_suggests_close_names(outcome):
    with pytest.raises(UnknownTarget) as error:
        explain(outcome.built, outcome.result.solution, "w1.wieght")
    assert "w1.weight" in error.value.suggestions and "w1.wieght" in str(error.value)


def test_plan_placements_map_back_to_the_solution(outcome):
    chosen, unmapped = solution_from_plan(outcome.built, outcome.plan)
    assert unmapped == []
    assert list(chosen) == list(outcome.result.solution)


def test_cli_explain_round_trip(outcome, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(outcome.plan), encoding="utf-8")
    runner = CliRunner()
    result = runner.invoke(app, ["explain", str(path), "w2.weight", "--json", "-q"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    direct = explain(outcome.built, outcome.result.solution, "w2.weight")
    assert (
        report["chosen"]["placements"]
        == direct["chosen"]["placements"]
        == outcome.plan["parameters"]["w2.weight"]
    )
    assert [a["strategy"] for a in report["alternatives"]] == [a["strategy"] for a in direct["alternatives"]]
    assert report["plan"]["consistent"] and report["plan"]["unmapped_nodes"] == []

    unknown = runner.invoke(app, ["explain", str(path), "w2.wieght", "-q"])
    assert unknown.exit_code == 2 and "w2.wieght" in unknown.output and "w2.weight" in unknown.output
    missing = runner.invoke(app, ["explain", str(tmp_path / "nope.json"), "w2.weight"])
    assert missing.exit_code == 2 and "no plan file" in missing.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"parameters": {"a": ["R"]}, "nodes": [{"name": "x"}]}), encoding="utf-8")
    broken = runner.invoke(app, ["explain", str(bad), "a", "-q"])
    assert broken.exit_code == 2 and "cannot explain" in broken.output


def test_cli_explain_says_one_line_of_progress_not_the_replans(outcome, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(outcome.plan), encoding="utf-8")
    result = CliRunner().invoke(app, ["explain", str(path), "w2.weight"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == ["rebuilding the problem of mlp from the plan's request"]
    assert "w2.weight" in result.stdout
