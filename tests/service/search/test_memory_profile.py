from __future__ import annotations

import numpy as np

from strategies.plan.plan_json import memory_profile


def test_a_long_profile_is_cut_to_256_points_keeping_the_peak() -> None:
    positions = np.arange(10_000)
    live = (np.sin(positions / 300.0) * 1000 + 5000).astype(np.int64)
    live[7777] = 99_999
    profile = memory_profile(positions, live)
    assert len(profile["positions"]) == len(profile["bytes"]) == 256
    assert max(profile["bytes"]) == 99_999
    assert profile["positions"][profile["bytes"].index(99_999)] == 7777
    assert profile["positions"] == sorted(profile["positions"])


def test_a_short_profile_is_kept_whole() -> None:
    profile = memory_profile(np.array([0, 3, 5]), np.array([10, 30, 20]))
    assert profile == {"positions": [0, 3, 5], "bytes": [10, 30, 20]}
