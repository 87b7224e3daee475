#!/usr/bin/env python3
"""Write the broker error classes of ``aioprod/errors.py`` from its ``_BROKER_ERROR_TABLE``.

The table of (code, name, retriable, invalid_metadata, description) rows in ``aioprod/errors.py`` is the source
of truth. This script rewrites the part of that file between the ``# BEGIN GENERATED`` and
``# END GENERATED`` marker lines: one explicit class per row (so mypy and IDEs see real
module attributes) and the ``ERRORS_BY_CODE`` mapping.

Usage::

    python tools/gen_error_classes.py          # rewrite the section in place
    python tools/gen_error_classes.py --check  # exit 1 if the section is out of date

The module is parsed, not imported, so a stale section never stops the script. Class naming
rule: split the protocol name on ``_``, drop a final ``ERROR`` or ``EXCEPTION`` word,
capitalise each word and append ``Error``; if that collides with a class defined outside
the generated section (the client-side errors), prefix ``Broker``.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

ERRORS_PY = Path(__file__).resolve().parent.parent / "aioprod" / "errors.py"
TABLE_NAME = "_BROKER_ERROR_TABLE"
BEGIN_PREFIX = "# BEGIN GENERATED"
END_LINE = "# END GENERATED"
_NAME_RE = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*")

Row = tuple[int, str, bool, bool, str]


def class_name(protocol_name: str, taken: frozenset[str] = frozenset()) -> str:
    """The exception class name for a protocol error name (see the module docstring)."""
    words = protocol_name.split("_")
    if len(words) > 1 and words[-1] in ("ERROR", "EXCEPTION"):
        words = words[:-1]
    name = "".join(word.capitalize() for word in words) + "Error"
    return "Broker" + name if name in taken else name


def _split(text: str) -> tuple[str, str, str]:
    """Split the module into (before, generated section body, after)."""
    lines = text.splitlines(keepends=True)
    begins = [i for i, line in enumerate(lines) if line.startswith(BEGIN_PREFIX)]
    ends = [i for i, line in enumerate(lines) if line.rstrip("\n") == END_LINE]
    if len(begins) != 1 or len(ends) != 1 or begins[0] > ends[0]:
        raise SystemExit(f"{ERRORS_PY}: expected one {BEGIN_PREFIX!r} line followed by one {END_LINE!r}")
    b, e = begins[0], ends[0]
    return "".join(lines[: b + 1]), "".join(lines[b + 1 : e]), "".join(lines[e:])


def _read_table(tree: ast.Module) -> list[Row]:
    value_nodes = [
        node.value
        for node in tree.body
        if isinstance(node, ast.AnnAssign | ast.Assign)
        and node.value is not None
        and any(
            isinstance(target, ast.Name) and target.id == TABLE_NAME
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        )
    ]
    if len(value_nodes) != 1:
        raise SystemExit(f"{ERRORS_PY}: expected exactly one {TABLE_NAME} assignment")
    value = ast.literal_eval(value_nodes[0])
    rows: list[Row] = []
    for row in value:
        ok = (
            isinstance(row, tuple)
            and len(row) == 5
            and type(row[0]) is int
            and isinstance(row[1], str)
            and _NAME_RE.fullmatch(row[1]) is not None
            and type(row[2]) is bool
            and type(row[3]) is bool
            and isinstance(row[4], str)
            and row[4].strip() == row[4] != ""
            and '"""' not in row[4]
            and "\\" not in row[4]
        )
        if not ok:
            raise SystemExit(f"{TABLE_NAME}: malformed row {row!r}")
        rows.append(row)
    codes = [row[0] for row in rows]
    if 0 in codes:
        raise SystemExit(f"{TABLE_NAME}: code 0 (NONE) is not an error and must not be listed")
    if codes != sorted(set(codes)):
        raise SystemExit(f"{TABLE_NAME}: codes must be unique and sorted")
    if len({row[1] for row in rows}) != len(rows):
        raise SystemExit(f"{TABLE_NAME}: duplicate protocol names")
    return rows


def render(rows: list[Row], taken: frozenset[str]) -> str:
    """The text that goes between the marker lines."""
    names = [class_name(row[1], taken) for row in rows]
    if len(set(names)) != len(names):
        raise SystemExit("two protocol names give the same class name; extend the naming rule")
    out: list[str] = []
    for (code, name, retriable, invalid_metadata, description), cls in zip(rows, names, strict=True):
        out += [
            "",
            "",
            f"class {cls}(BrokerResponseError):",
            f'    """{description}"""',
            "",
            f"    code = {code}",
            f"    name = {json.dumps(name)}",
            f"    retriable = {retriable}",
            *([f"    invalid_metadata = {invalid_metadata}"] if invalid_metadata else []),
            f"    description = {json.dumps(description)}",
        ]
    out += [
        "",
        "",
        "#: Exception class for every known non-zero protocol error code.",
        "ERRORS_BY_CODE: Final[Mapping[int, type[BrokerResponseError]]] = MappingProxyType(",
        "    {",
        *(f"        {row[0]}: {cls}," for row, cls in zip(rows, names, strict=True)),
        "    }",
        ")",
    ]
    return "\n".join(out) + "\n"


def generate(text: str) -> str:
    """Return ``text`` (the content of errors.py) with the generated section rewritten."""
    before, _, after = _split(text)
    tree = ast.parse(before + after)
    rows = _read_table(tree)
    taken = frozenset(node.name for node in tree.body if isinstance(node, ast.ClassDef))
    return before + render(rows, taken) + after


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="only report whether the file is up to date")
    args = parser.parse_args(argv)
    current = ERRORS_PY.read_text(encoding="utf-8")
    updated = generate(current)
    if args.check:
        if updated != current:
            print(f"{ERRORS_PY} is out of date; run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    if updated != current:
        ERRORS_PY.write_text(updated, encoding="utf-8")
        print(f"rewrote {ERRORS_PY}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
