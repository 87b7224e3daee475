"""README's command-line section: it works as written after the Quick start (point 8)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.cli.conftest import aioprod

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, re.MULTILINE | re.DOTALL)
    assert match is not None, title
    return match.group(1)


def shell_lines(text: str) -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", text, re.DOTALL)
    return [line.split("  #")[0].strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_the_cli_section_activates_the_quick_start_venv_first() -> None:
    quick_start = " ".join(shell_lines(section("Quick start")))
    assert "python3 -m venv .venv" in quick_start
    lines = shell_lines(section("Command line"))
    first_bare = next(i for i, line in enumerate(lines) if re.search(r"(^|\| )aioprod ", line))
    assert ". .venv/bin/activate" in lines[:first_bare]


@pytest.mark.integration
def test_the_produce_and_metadata_examples_run(bootstrap: str) -> None:
    """The README's produce and metadata lines, against the embedded broker instead of localhost."""
    lines = [line.replace("localhost:9092", bootstrap) for line in shell_lines(section("Command line"))]
    produce = next(line for line in lines if " produce " in line)
    piped, command = produce.split(" | ")
    produced = aioprod(*shlex.split(command)[1:], input=shlex.split(piped)[1] + "\n")
    assert produced.exit_code == 0, produced.output
    metadata = next(line for line in lines if line.startswith("aioprod metadata"))
    shown = aioprod(*shlex.split(metadata)[1:])
    assert shown.exit_code == 0, shown.output
    assert re.search(r"^greetings\s+\d+\s", shown.stdout, re.MULTILINE)
