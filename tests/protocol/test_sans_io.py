"""The protocol layer does no I/O: no module under aioprod/protocol imports an I/O or clock module."""

from __future__ import annotations

import ast
from pathlib import Path

import aioprod.protocol

FORBIDDEN = {"asyncio", "socket", "selectors", "ssl", "time", "threading", "anyio", "uvloop"}


def test_protocol_modules_import_no_io() -> None:
    root = Path(aioprod.protocol.__file__).parent
    offenders = []
    files = sorted(root.rglob("*.py"))
    assert len(files) >= 8
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(root)}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []
