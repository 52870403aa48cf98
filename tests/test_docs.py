"""The user's pages (README.md, docs/*.md) as a user runs them: every fenced code block runs, in page order,
so none goes stale; every relative link leads to a file (and heading) that exists.

How a block is taken, by its info string:

- ``bash``: run by bash (``-e -o pipefail``) in the page's own working folder, with this checkout's
  ``autoshard`` (a wrapper running ``python -m service.cli`` on this checkout) and ``python`` first on
  PATH; it must exit 0.
- ``python``: run by this interpreter in the same folder, with this checkout importable; it must exit 0.
- ``json`` / ``yaml``: parsed; a ``check`` mark (below) validates it with the code that reads such a document.
- ``text``: output the block before it prints: each line must match a line of that output, with every
  number free (figures change with the machine, wording and shape must not).
- ``diagram``: a picture, nothing to run.

Marks are an HTML comment on the line right before the fence, ``key: value`` pairs joined by ``;``:

- ``not run: REASON``: the block is not run here (GPUs, the whole suite, 40-minute benchmarks); the reason
  is required, and such marks stay rare (:data:`MOST_NOT_RUN`).
- ``file: NAME``: the block is saved as NAME in the page's folder, as the text tells the reader to.
- ``check: KIND``: a data block is a hardware file (``hardware``, loaded by ``load_hardware``), a plan request
  (``plan-request``, the service's ``PlanSubmission``) or a search request (``search-request``).

Pages that call the service (``localhost:8000``) share one server: the README's block that starts it, run
once by the :func:`service` fixture on a free port (8000 in every block of those pages is that port).

docs/python-api.md is not run here: its one Python block is run as written under ``torchrun`` on 4 ranks by
``tests/test_python_api.py`` (:func:`test_the_python_api_page_is_run_by_its_own_test` holds that so).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.service.postgres import free_port

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_ELSEWHERE = {ROOT / "docs" / "python-api.md": ROOT / "tests" / "test_python_api.py"}
"""Pages whose blocks another test runs -> that test."""
RUN_HERE = [page for page in PAGES if page not in RUN_ELSEWHERE]
KINDS = ("bash", "python", "json", "yaml", "text", "diagram")
MOST_NOT_RUN = 3
"""Blocks marked ``not run`` across every page: a budget that keeps them the exception."""
BLOCK_TIMEOUT_S = 300
SERVICE_PORT = "8000"
"""The port the pages' service examples use; replaced by the shared server's."""
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
MARK = re.compile(r"^<!--(.*)-->$")
NUMBER = re.compile(r"\d[\d,.]*")
TOKEN = re.compile(r"(\s+|\d[\d,.]*)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@dataclass
class Block:
    page: Path
    line: int
    kind: str
    text: str
    marks: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def page_blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, in order, each with the marks of the comment right before its fence."""
    text = page.read_text(encoding="utf-8")
    blocks = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        comment = MARK.match(before)
        marks = {}
        if comment:
            for pair in comment.group(1).split(";"):
                key, _, value = pair.partition(":")
                marks[key.strip()] = value.strip()
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(Block(page, line, match.group(1).strip(), match.group(2), marks))
    return blocks


def uses_service(page: Path) -> bool:
    return f"localhost:{SERVICE_PORT}" in page.read_text(encoding="utf-8")


def starts_service(block: Block) -> bool:
    return block.kind == "bash" and "autoshard serve" in block.text and "not run" not in block.marks


@dataclass
class Workspace:
    """Where the pages' blocks run: a PATH with this checkout's ``autoshard``, and the sessions to stop."""

    folder: Path
    env: dict[str, str]
    port: str
    sessions: list[int] = field(default_factory=list)

    def page_folder(self, page: Path) -> Path:
        """A fresh folder for one page, with the repository's bundled data where the pages name it."""
        folder = self.folder / page.stem
        folder.mkdir()
        (folder / "benchmarks").symlink_to(ROOT / "benchmarks")
        return folder

    def run(self, block: Block, folder: Path) -> str:
        """Run a bash or python block; its stdout and stderr together."""
        text = block.text.replace(SERVICE_PORT, self.port) if uses_service(block.page) else block.text
        command = (
            ["bash", "-e", "-o", "pipefail", "-c", text]
            if block.kind == "bash"
            else [sys.executable, "-c", text]
        )
        process = subprocess.Popen(
            command,
            cwd=folder,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # what a block leaves running (a server) is stopped with its group
        )
        self.sessions.append(process.pid)
        try:
            output, _ = process.communicate(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            message = f"{block.where}: still running after {BLOCK_TIMEOUT_S} s:\n{output[-4000:]}"
            raise AssertionError(message) from None
        assert process.returncode == 0, f"{block.where} exited {process.returncode}:\n{output[-4000:]}"
        return output

    def stop(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGKILL):
            for session in self.sessions:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(session, signum)
            time.sleep(1)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workspace]:
    folder = tmp_path_factory.mktemp("docs")
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "autoshard"
    # This checkout's CLI: the installed console script would import the code it was installed from.
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m service.cli "$@"\n', encoding="utf-8")
    wrapper.chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    env = {key: value for key, value in os.environ.items() if not key.startswith("AUTOSHARD_")}
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    space = Workspace(folder, env, str(free_port()))
    yield space
    space.stop()


@pytest.fixture(scope="module")
def service(workspace: Workspace) -> str:
    """The README's block that starts the service, run once; the pages that call the service share it."""
    (block,) = [b for b in page_blocks(ROOT / "README.md") if starts_service(b)]
    folder = workspace.folder / "service"
    folder.mkdir()
    workspace.run(block, folder)
    return f"http://localhost:{workspace.port}"


def test_every_block_is_of_a_known_kind_and_every_mark_is_understood() -> None:
    not_run = []
    for page in PAGES:
        for block in page_blocks(page):
            assert block.kind in KINDS, f"{block.where}: say what the block is: one of {KINDS}"
            assert set(block.marks) <= {"not run", "file", "check"}, (
                f"{block.where}: unknown mark {block.marks}"
            )
            if "not run" in block.marks:
                assert len(block.marks["not run"]) >= 10, f"{block.where}: say why the block is not run"
                not_run.append(block.where)
            if "check" in block.marks:
                assert block.kind in ("json", "yaml"), f"{block.where}: only data blocks are checked"
    assert len(not_run) <= MOST_NOT_RUN, f"blocks not run: {not_run}; run them, or make them small enough to"


def test_the_python_api_page_is_run_by_its_own_test() -> None:
    for page, test in RUN_ELSEWHERE.items():
        assert [b.kind for b in page_blocks(page)] == ["python"], page
        assert f'"docs" / "{page.name}"' in test.read_text(encoding="utf-8"), f"{test} no longer runs {page}"


@pytest.mark.parametrize("page", RUN_HERE, ids=[str(page.relative_to(ROOT)) for page in RUN_HERE])
def test_the_pages_blocks_run_as_written(
    page: Path, workspace: Workspace, request: pytest.FixtureRequest
) -> None:
    if uses_service(page):
        request.getfixturevalue("service")
    folder = workspace.page_folder(page)
    output: str | None = None
    for block in page_blocks(page):
        if "not run" in block.marks or block.kind == "diagram" or starts_service(block):
            output = None
        elif block.kind in ("bash", "python"):
            output = workspace.run(block, folder)
        elif block.kind == "text":
            assert output is not None, f"{block.where}: output of what? put it after the block that prints it"
            assert_shows(block, output)
        else:
            check_data(block, folder)
            output = None


def assert_shows(block: Block, output: str) -> None:
    """Each line of the block matches a line of ``output``, numbers aside."""
    lines = output.splitlines()
    for expected in filter(None, (line.strip() for line in block.text.splitlines())):
        pattern = "".join(
            r"\s+" if token.isspace() else NUMBER.pattern if NUMBER.fullmatch(token) else re.escape(token)
            for token in TOKEN.split(expected)
            if token
        )
        assert any(re.search(pattern, line) for line in lines), (
            f"{block.where}: {expected!r} is not in the output:\n{output[-4000:]}"
        )


def check_data(block: Block, folder: Path) -> None:
    """Parse a JSON or YAML block, save it when marked ``file``, validate it when marked ``check``."""
    import json

    data = json.loads(block.text) if block.kind == "json" else yaml.safe_load(block.text)
    path = folder / block.marks["file"] if "file" in block.marks else None
    if path is not None:
        path.write_text(block.text, encoding="utf-8")
    kind = block.marks.get("check")
    if kind == "hardware":
        from strategies.cost.hardware import load_hardware, override_hardware

        assert (load_hardware(path) if path is not None else override_hardware(data)).name
    elif kind == "plan-request":
        from service.submissions import PlanSubmission

        PlanSubmission.model_validate(data)
    elif kind == "search-request":
        from service.submissions import SearchSubmission

        SearchSubmission.model_validate(data)
    else:
        assert kind is None, f"{block.where}: unknown check {kind!r}"


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def test_every_relative_link_leads_to_a_file_and_heading_that_exist() -> None:
    broken = []
    for page in [*PAGES, ROOT / "benchmarks" / "README.md"]:
        for target in LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
            if re.match(r"^[a-z]+:", target):
                continue
            path_text, _, anchor = target.partition("#")
            path = (page.parent / path_text).resolve() if path_text else page
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_no_page_cites_a_folder_outside_the_repository() -> None:
    for page in [*PAGES, ROOT / "benchmarks" / "README.md"]:
        text = page.read_text(encoding="utf-8")
        assert "../shared" not in text and "DESIGN.md" not in text, (
            f"{page.relative_to(ROOT)} cites ../shared"
        )


def test_no_code_reads_a_folder_outside_the_repository() -> None:
    """A user's clone has no `../shared` beside it: no script, test, Makefile or image may look there."""
    folders = ("autoshard", "runtime", "service", "solver", "strategies", "tests", "benchmarks", "examples")
    sources = [path for folder in folders for path in (ROOT / folder).rglob("*.py")]
    sources += [ROOT / "Makefile", ROOT / ".ci" / "run", *(ROOT / "docker").glob("*Dockerfile")]
    outside = re.compile(r"\.\./shared|[\"']shared[\"']\s*/")
    here = Path(__file__).resolve()
    found = [str(p.relative_to(ROOT)) for p in sources if p != here and outside.search(p.read_text("utf-8"))]
    assert found == []
