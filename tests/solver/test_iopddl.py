"""Reading and writing the IOPDDL format: exact round trips and errors that name the field."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from solver import iopddl
from solver.errors import ProblemError
from tests.bundled_data import EXAMPLE, INSTANCE_G


def test_example_round_trips_exactly(tmp_path: Path) -> None:
    original = json.loads((EXAMPLE).read_text())
    problem = iopddl.load(EXAMPLE)
    assert iopddl.to_dict(problem) == original
    iopddl.save(problem, tmp_path / "copy.json.gz")
    again = iopddl.load(tmp_path / "copy.json.gz")
    assert again.content_hash == problem.content_hash


def test_contest_instance_round_trips_exactly_with_forbidden_costs(tmp_path: Path) -> None:
    with gzip.open(INSTANCE_G, "rt") as handle:
        original = json.load(handle)
    problem = iopddl.load(INSTANCE_G)
    assert problem.is_integral
    assert iopddl.to_dict(problem) == original


def test_groups_and_pins_round_trip(tmp_path: Path) -> None:
    problem = iopddl.load(EXAMPLE).replace(groups=((3, 1),), pins={2: 1})
    iopddl.save(problem, tmp_path / "p.json")
    again = iopddl.load(tmp_path / "p.json")
    assert again.groups == ((3, 1),)
    assert dict(again.pins) == {2: 1}


def _write(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    return path


def _example_document() -> dict:
    return json.loads((EXAMPLE).read_text())


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.pop("problem"), "problem"),
        (lambda d: d["problem"].pop("nodes"), "problem.nodes"),
        (lambda d: d["problem"]["nodes"]["costs"].__setitem__(1, [55, "x"]), "problem.nodes.costs[1]"),
        (lambda d: d["problem"]["nodes"]["usages"].pop(), "problem.nodes.usages"),
        (lambda d: d["problem"]["nodes"]["intervals"].__setitem__(0, [30]), "problem.nodes.intervals[0]"),
        (lambda d: d["problem"]["edges"]["costs"].__setitem__(2, [1, 2, 3]), "problem.edges.costs[2]"),
        (lambda d: d["problem"]["edges"]["nodes"].__setitem__(0, [0, 9]), "problem.edges.nodes[0]"),
        (lambda d: d["problem"]["edges"]["nodes"].__setitem__(0, [0, -1]), "problem.edges.nodes[0]"),
        (lambda d: d["problem"].__setitem__("usage_limit", "lots"), "problem.usage_limit"),
        (lambda d: d["problem"]["nodes"]["costs"].__setitem__(0, [2**55]), "problem.nodes.costs[0]"),
    ],
)
def test_malformed_documents_name_the_field(tmp_path: Path, mutate, field: str) -> None:
    document = _example_document()
    mutate(document)
    with pytest.raises(ProblemError) as error:
        iopddl.load(_write(tmp_path, document))
    assert error.value.field == field


def test_invalid_json_and_missing_file_are_problem_errors(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ProblemError, match="not valid JSON"):
        iopddl.load(broken)
    with pytest.raises(ProblemError, match="no such file"):
        iopddl.load(tmp_path / "missing.json")


def test_nan_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "nan.json"
    path.write_text((EXAMPLE).read_text().replace("[15]", "[NaN]"))
    with pytest.raises(ProblemError) as error:
        iopddl.load(path)
    assert error.value.field == "problem.nodes.costs[0]"
