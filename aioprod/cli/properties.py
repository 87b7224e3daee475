"""Java ``.properties`` files, as the Kafka tools read them (``--producer.config``, kcat ``-F``).

The format of ``java.util.Properties.load``: ``key=value``, ``key: value`` or ``key value``;
``#`` and ``!`` start comment lines; a line ending in an odd number of backslashes continues
on the next (leading whitespace there is dropped); ``\\t \\n \\r \\f \\uXXXX`` and ``\\x`` for
any other ``x`` are escapes, in keys and values alike.
"""

from __future__ import annotations

import re
from pathlib import Path

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_SEPARATORS = "=: \t\f"


class PropertiesError(ValueError):
    """A malformed properties file; the message names the file and line."""


def load_properties(path: Path) -> list[tuple[str, str, int]]:
    """``(key, value, line number)`` for each property of the file, in order."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PropertiesError(f"cannot read {path}: {exc}") from exc
    return parse_properties(text, str(path))


_SECRET = re.compile(r"password|secret|token|jaas", re.IGNORECASE)


def names_secret(text: str) -> bool:
    """Whether an option's name (or a ``key=value`` item) is a secret's: its value is never echoed."""
    return _SECRET.search(text) is not None


def parse_properties(text: str, name: str = "<properties>") -> list[tuple[str, str, int]]:
    out = []
    for line, number in _logical_lines(text):
        key, value = _split(line)
        try:
            out.append((_unescape(key), _unescape(value), number))
        except ValueError as exc:
            if names_secret(key):
                # As -X: a secret's value is never echoed, not even the piece around a bad escape.
                raise PropertiesError(f"{name}:{number}: {key}: malformed \\uXXXX escape (value hidden)") from None
            raise PropertiesError(f"{name}:{number}: {exc}") from None
    return out


def _logical_lines(text: str) -> list[tuple[str, int]]:
    """Non-blank, non-comment lines with continuations joined; each with its first line number."""
    lines = text.splitlines()
    out = []
    index = 0
    while index < len(lines):
        number = index + 1
        line = lines[index].lstrip(" \t\f")
        index += 1
        if not line or line[0] in "#!":
            continue
        while _continues(line) and index < len(lines):
            line = line[:-1] + lines[index].lstrip(" \t\f")
            index += 1
        if _continues(line):  # a backslash on the very last line is dropped, as Java does
            line = line[:-1]
        out.append((line, number))
    return out


def _continues(line: str) -> bool:
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


def _split(line: str) -> tuple[str, str]:
    """The key ends at the first unescaped separator; one ``=`` or ``:`` and whitespace around it go."""
    index = 0
    while index < len(line):
        char = line[index]
        if char == "\\":
            index += 2
            continue
        if char in _SEPARATORS:
            break
        index += 1
    key, rest = line[:index], line[index:]
    rest = rest.lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return key, rest


def _unescape(text: str) -> str:
    out = []
    index = 0
    while index < len(text):
        char = text[index]
        if char != "\\" or index + 1 == len(text):
            out.append(char)
            index += 1
            continue
        escaped = text[index + 1]
        if escaped == "u":
            digits = text[index + 2 : index + 6]
            if len(digits) != 4 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise ValueError(f"malformed \\uXXXX escape: {text[index : index + 6]!r}")
            out.append(chr(int(digits, 16)))
            index += 6
            continue
        out.append(_ESCAPES.get(escaped, escaped))
        index += 2
    return "".join(out)
