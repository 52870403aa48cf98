"""The collector's thresholds in the CLI's process: raised for the one-shot commands (planning traces make
millions of long-lived objects), Python's own for the long-lived ones (a server, training steps)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service import cli


def test_a_run_collects_as_python_does(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    before = gc.get_threshold()
    gc.set_threshold(*cli.GC_THRESHOLDS)  # as main() leaves it for every command
    calls: list[tuple[int, ...]] = []
    real = gc.set_threshold

    def recording(*values: int) -> None:
        calls.append(values)
        real(*values)

    monkeypatch.setattr(gc, "set_threshold", recording)
    try:
        arguments = ["run", "--model", "mlp", "--plan", str(tmp_path / "p.json"), "--optimizer", "lion"]
        result = CliRunner().invoke(cli.app, arguments)
        assert result.exit_code == 2  # refused before any work
        assert calls == [cli.PYTHON_GC_THRESHOLDS]
        assert gc.get_threshold() == cli.PYTHON_GC_THRESHOLDS != cli.GC_THRESHOLDS
    finally:
        real(*before)
