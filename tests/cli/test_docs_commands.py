"""The commands the README and docs/ show, run as written, their quoted output compared.

A ```console block holds ``$ cclc ...`` lines, each followed by the lines it prints. ``...``
stands for lines left out; every other quoted line must appear, in order, and lines quoted
next to each other must be next to each other in the output. A command that must exit with
another status than 0 says so in a trailing shell comment, ``# exit status 1``.

The blocks run in a scratch folder holding a copy of ``examples/``; the README's tour runs
after the README's own first compile, as its text says.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
EXIT_NOTE = re.compile(r"\s+#\s*exit status (\d+)\s*$")


@dataclass(frozen=True)
class Shown:
    """One ``$ command`` of a page and what the page says it prints."""

    page: str
    line: int
    command: str
    status: int
    quoted: tuple[str, ...]


def console_blocks(text: str) -> list[list[tuple[int, str]]]:
    """Each ```console block of a page as its (line number, text) lines."""
    blocks, current, inside = [], [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if not inside and line.strip() == "```console":
            inside, current = True, []
        elif inside and line.strip() == "```":
            inside = False
            blocks.append(current)
        elif inside:
            current.append((number, line))
    return blocks


def shown_commands(page: Path) -> list[list[Shown]]:
    out = []
    for block in console_blocks(page.read_text(encoding="utf-8")):
        commands: list[Shown] = []
        for number, line in block:
            if line.startswith("$ "):
                command, status = line[2:], 0
                note = EXIT_NOTE.search(command)
                if note:
                    command, status = command[:note.start()], int(note.group(1))
                commands.append(Shown(page.name, number, command, status, ()))
            elif commands:
                last = commands[-1]
                commands[-1] = Shown(last.page, last.line, last.command, last.status,
                                     (*last.quoted, line.rstrip()))
        out.append(commands)
    return out


def matches(quoted: tuple[str, ...], printed: list[str]) -> str | None:
    """``None`` when ``printed`` shows every quoted line as described above, else why not."""
    segments: list[list[str]] = [[]]
    for line in quoted:
        if line.strip() == "...":
            segments.append([])
        else:
            segments[-1].append(line)
    at = 0
    for i, segment in enumerate(segments):
        if not segment:
            continue
        anchored = i == 0
        found = None
        for start in range(at, len(printed) - len(segment) + 1):
            if printed[start:start + len(segment)] == segment:
                found = start
                break
            if anchored:
                break
        if found is None:
            return f"not printed {'at the start' if anchored else 'in order'}: {segment[0]!r}"
        at = found + len(segment)
    if segments[-1] and at != len(printed):
        return f"printed more after {segments[-1][-1]!r}: {printed[at]!r}"
    return None


def run_shown(shown: Shown, cwd: Path) -> None:
    argv = shlex.split(shown.command, comments=True)
    assert argv and argv[0] == "cclc", f"{shown.page}:{shown.line}: not a cclc command"
    env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "cclc.cli", *argv[1:]], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    where = f"{shown.page}:{shown.line}: $ {shown.command}"
    assert done.returncode == shown.status, (
        f"{where}\nexit status {done.returncode}, the page says {shown.status}\n"
        f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    printed = [line.rstrip() for line in (done.stdout + done.stderr).splitlines()]
    why = matches(shown.quoted, printed)
    assert why is None, f"{where}\n{why}\nprinted:\n" + "\n".join(printed[:60])


def _scratch(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    return tmp_path


def _readme_first_compile() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```sh\n(.*?)```", text, flags=re.DOTALL)
    assert block, "the README starts with a ```sh block of commands"
    first = block.group(1).splitlines()[0]
    return "cclc compile" + first.split("cclc compile", 1)[1]


BLOCKS = [(page, i) for page in PAGES for i, _ in enumerate(shown_commands(page))]


@pytest.mark.slow
@pytest.mark.parametrize("page, index", BLOCKS,
                         ids=[f"{p.relative_to(ROOT)}#{i}" for p, i in BLOCKS])
def test_console_block_runs_as_shown(page: Path, index: int, tmp_path: Path) -> None:
    cwd = _scratch(tmp_path)
    if page.name == "README.md":
        run_shown(Shown("README.md", 3, _readme_first_compile(), 0, ("...",)), cwd)
    for shown in shown_commands(page)[index]:
        run_shown(shown, cwd)


def test_the_readme_has_a_tour() -> None:
    assert shown_commands(ROOT / "README.md"), "the README shows its commands in a console block"


def test_quoted_lines_must_match() -> None:
    printed = ["a", "b", "c", "d"]
    assert matches(("a", "b", "..."), printed) is None
    assert matches(("...", "c", "d"), printed) is None
    assert matches(("a", "...", "d"), printed) is None
    assert matches(("b", "..."), printed) is not None       # not at the start
    assert matches(("a", "c", "..."), printed) is not None  # not next to each other
    assert matches(("a", "b"), printed) is not None         # more printed than quoted
    assert matches(("...", "x"), printed) is not None
