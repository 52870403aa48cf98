"""A real search's results (``mlp`` over 8 devices, planned candidate by candidate) shared by the report's
tests, and the page rendered from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.search.report import write_report
from tests.service.search.search_results import build_results


@pytest.fixture(scope="module")
def search(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """(results, results folder) of a search, its ``report.html`` written beside ``results.json``."""
    folder = tmp_path_factory.mktemp("search")
    results = build_results(folder)
    write_report(folder)
    return results, folder
