"""Java .properties files (``-F``), read as ``java.util.Properties.load`` reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from aioprod.cli.properties import PropertiesError, load_properties, parse_properties


def test_separators_comments_and_blank_lines() -> None:
    text = "# comment\n! also a comment\n\n  a=1\nb: 2\nc 3\nd\t=\t4\ne =\nf\n"
    assert [(k, v) for k, v, _ in parse_properties(text)] == [
        ("a", "1"),
        ("b", "2"),
        ("c", "3"),
        ("d", "4"),
        ("e", ""),
        ("f", ""),
    ]


def test_continuations_escapes_and_line_numbers() -> None:
    text = (
        "sasl.jaas.config=first \\\n"
        "    second\n"
        "key\\ with\\ spaces = tab\\there\n"
        "unicode=caf\\u00e9\n"
        "a\\=b=c\n"
        "odd=one\\\\\n"
        "next=x\n"
    )
    assert parse_properties(text) == [
        ("sasl.jaas.config", "first second", 1),
        ("key with spaces", "tab\there", 3),
        ("unicode", "café", 4),
        ("a=b", "c", 5),
        ("odd", "one\\", 6),  # an even number of backslashes does not continue the line
        ("next", "x", 7),
    ]


def test_errors_name_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.properties"
    path.write_text("ok=1\nbad=\\u12\n")
    with pytest.raises(PropertiesError, match=r"bad\.properties:2: malformed \\uXXXX escape"):
        load_properties(path)
    with pytest.raises(PropertiesError, match="cannot read"):
        load_properties(tmp_path / "missing.properties")
