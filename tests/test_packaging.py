"""The wheel, as the images install it: ``python -m build`` makes it, a fresh venv installs it (not editable),
and from outside the repository its ``autoshard`` plans, searches, serves (the migrations found: a plan job
runs through the service's database) and ``import autoshard`` works.

The fresh venv takes its third-party dependencies (torch, numpy, ...) from this project's venv through a
``.pth`` line, not from the network: what is tested is the wheel's own content (packages, entry point,
migrations), each module of it imported from the fresh venv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from service.client import AutoshardClient
from tests.service.server import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
SMALL_MLP = {"d": 64, "h": 128}
SOURCES = ("pyproject.toml", "README.md", "autoshard", "service", "solver", "strategies", "runtime")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin folder of a fresh venv with the built wheel installed."""
    where = tmp_path_factory.mktemp("packaging")
    sources = where / "src"  # what the Dockerfiles copy: the build leaves nothing in the repository
    sources.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, sources / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, sources / name)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(where / "dist"),
            str(sources),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (where / "dist").glob("autoshard-*.whl")
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    installing = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installing.returncode == 0, installing.stderr[-3000:]
    return venv / "bin"


def run(bin_folder: Path, *command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.run(
        [str(bin_folder / command[0]), *command[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_installed_package_is_the_wheels_not_the_sources(installed, tmp_path) -> None:
    code = (
        "import autoshard, service, strategies, solver, runtime; print(service.__file__, autoshard.__file__)"
    )
    done = run(installed, "python", "-c", code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for path in done.stdout.split():
        assert Path(path).is_relative_to(installed.parent) and not Path(path).is_relative_to(ROOT / "service")


def test_the_installed_command_plans_and_searches(installed, tmp_path) -> None:
    options = json.dumps(SMALL_MLP)
    planned = run(
        installed, "autoshard", "plan", "--model", "mlp", "--mesh", "2", "--out", "plan.json", cwd=tmp_path
    )
    assert planned.returncode == 0, planned.stderr
    assert json.loads((tmp_path / "plan.json").read_text())["mesh"]["shape"] == [2]
    searched = run(
        installed,
        "autoshard",
        "search",
        "--model",
        "mlp",
        "--devices",
        "2",
        "--options",
        options,
        "--batch-sizes",
        "64",
        "--out",
        "search",
        cwd=tmp_path,
    )
    assert searched.returncode == 0, searched.stderr
    assert (tmp_path / "search" / "results.json").exists() and (tmp_path / "search" / "report.html").exists()


def test_the_installed_service_migrates_its_database_and_plans(installed, tmp_path) -> None:
    server = ServerProcess(
        f"sqlite:///{tmp_path / 'autoshard.db'}",
        tmp_path / "serve.log",
        command=installed / "autoshard",
        workers=1,
        poll_s=0.2,
    )
    server.start()
    try:
        server.wait_ready()
        with AutoshardClient(server.url) as client:
            request = {"model": "mlp", "mesh": {"shape": [2]}, "solver": {"time_limit_s": 5}}
            plan = client.plan(request, timeout_s=120)
        assert plan["mesh"]["shape"] == [2] and plan["predicted"]["step_time_s"] > 0
        assert (tmp_path / "autoshard.db").stat().st_size > 0  # migrated, the plan stored
    finally:
        server.stop()
