"""Reading and writing the IOPDDL format: exact round trips and errors that name the field."""

from __future__ import annotations

import gzip
import json
import math
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


# ------------------------------------------------------------------------------------------------- pins


@pytest.mark.parametrize(
    ("pins", "message"),
    [
        ({"0": math.inf}, "values must be strategy indices, integers within int64"),
        ({"0": 1.5}, "values must be strategy indices, integers within int64"),
        ({"0": True}, "values must be strategy indices, integers within int64"),
        ({"0": "1"}, "values must be strategy indices, integers within int64"),
        ({"0": 2**63}, "values must be strategy indices, integers within int64"),
        ({"1.5": 0}, "keys must be node indices, at most 18 decimal digits"),
        ({"-1": 0}, "keys must be node indices, at most 18 decimal digits"),
        ({"1e400": 0}, "keys must be node indices, at most 18 decimal digits"),
        ({"٣": 0}, "keys must be node indices, at most 18 decimal digits"),  # an Arabic-Indic three
        ({"9" * 19: 0}, "keys must be node indices, at most 18 decimal digits"),
    ],
)
@pytest.mark.parametrize("strict", [False, True])
def test_pins_are_decimal_node_keys_to_integer_strategies_in_both_modes(
    pins: dict, message: str, strict: bool
) -> None:
    document = _example_document()
    document["problem"]["pins"] = pins
    with pytest.raises(ProblemError) as error:
        iopddl.from_dict(document, strict=strict)
    assert (error.value.field, error.value.message) == ("problem.pins", message)


def test_pins_from_json_1e400_are_a_problem_error_not_an_overflow() -> None:
    document = json.loads('{"problem": {"nodes": {"costs": [[1, 2]]}, "pins": {"0": 1e400}}}')
    with pytest.raises(ProblemError) as error:
        iopddl.from_dict(document)
    assert error.value.field == "problem.pins"


def test_pins_accept_int_keys_and_decimal_strings() -> None:
    document = _example_document()
    document["problem"]["pins"] = {"2": 1, 3: 0}
    assert dict(iopddl.from_dict(document, strict=True).pins) == {2: 1, 3: 0}


def test_a_huge_usage_limit_is_a_problem_error() -> None:
    document = _example_document()
    document["problem"]["usage_limit"] = 2**63
    with pytest.raises(ProblemError) as error:
        iopddl.from_dict(document)
    assert error.value.field == "problem.usage_limit"


# ---------------------------------------------------------------------------------------- strict reading


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.__setitem__("solution", [0]), "solution"),
        (lambda d: d["problem"].__setitem__("owner", "x"), "problem.owner"),
        (lambda d: d["problem"]["nodes"].__setitem__("names", []), "problem.nodes.names"),
        (lambda d: d["problem"]["edges"].__setitem__("weights", []), "problem.edges.weights"),
    ],
)
def test_a_strict_read_refuses_unknown_keys_by_name_and_a_lenient_one_ignores_them(
    mutate, field: str
) -> None:
    document = _example_document()
    mutate(document)
    with pytest.raises(ProblemError) as error:
        iopddl.from_dict(document, strict=True)
    assert (error.value.field, error.value.message) == (field, "unknown field")
    assert iopddl.from_dict(document).num_nodes == 5


@pytest.mark.parametrize("name", ["n" * 257, 7, None])
def test_a_strict_read_takes_a_name_of_at_most_256_characters(name: object) -> None:
    document = _example_document()
    document["problem"]["name"] = name
    with pytest.raises(ProblemError) as error:
        iopddl.from_dict(document, strict=True)
    assert (error.value.field, error.value.message) == (
        "problem.name",
        "must be a string of at most 256 characters",
    )
    document["problem"]["name"] = "n" * 256
    assert iopddl.from_dict(document, strict=True).name == "n" * 256


def test_a_strict_read_of_a_well_formed_document_equals_a_lenient_one() -> None:
    document = _example_document()
    document["problem"].update(groups=[[3, 1]], pins={"2": 1})
    strict = iopddl.from_dict(document, strict=True)
    assert strict.content_hash == iopddl.from_dict(document).content_hash
