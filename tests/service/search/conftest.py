"""Small searches shared by the search tests: an MLP and a 2-layer GPT over 8 devices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.search.request import SearchRequest
from service.search.runner import run_search

GPT = {"dim": 128, "n_heads": 4, "vocab_size": 256, "max_seq_len": 64, "ffn_dim": 512}
MLP_OPTIONS = {"d": 256, "h": 1024}


def mlp_search(**fields: Any) -> SearchRequest:
    values: dict[str, Any] = {
        "model": "mlp",
        "devices": 8,
        "batch_sizes": [64, 1024],
        "options": MLP_OPTIONS,
        "dtype": "float32",
        "workers": 2,
        "time_limit_s": 20.0,
        "gap": 0.0,
        "prune": False,  # every row planned to the end, as planning it alone does
        **fields,
    }
    return SearchRequest(**values)


def gpt_search(**fields: Any) -> SearchRequest:
    values: dict[str, Any] = {
        "model": "gpt2-small",
        "devices": 8,
        "batch_sizes": [8],
        "seq": 32,
        "layers": 2,
        "options": GPT,
        "dtype": "float32",
        "workers": 2,
        "time_limit_s": 60.0,  # the 2x2x2 candidate is proven optimal in 8.5 s alone, 2-3x that under load
        "gap": 0.0,
        "prune": False,
        **fields,
    }
    return SearchRequest(**values)


@pytest.fixture(scope="session")
def mlp_results(tmp_path_factory: pytest.TempPathFactory) -> tuple[SearchRequest, dict[str, Any], Path]:
    """The MLP search on the local process pool, with its output folder."""
    out = tmp_path_factory.mktemp("mlp-search")
    request = mlp_search()
    return request, run_search(request, out), out
