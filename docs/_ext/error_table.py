"""An mkdocs hook: the table of broker error codes on the errors page, from ``aioprod.errors``.

Written at build time from the same table the classes are generated from, so it cannot
drift; the page's ``<!-- broker error table -->`` marker is replaced by it.
"""

from __future__ import annotations

from typing import Any

MARKER = "<!-- broker error table -->"


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    from aioprod.errors import ERRORS_BY_CODE

    rows = ["| code | name | class | retriable |", "| ---: | --- | --- | --- |"]
    for code, cls in sorted(ERRORS_BY_CODE.items()):
        link = f"[`{cls.__name__}`](#aioprod.errors.{cls.__name__})"
        rows.append(f"| {code} | `{cls.name}` | {link} | {'yes' if cls.retriable else 'no'} |")
    return markdown.replace(MARKER, "\n".join(rows))
