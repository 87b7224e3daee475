"""Every dotted ``aioprod....`` name the README and the docs show resolves to something.

A reader copies ``aioprod.X`` into an import or a type hint; migration.md once named
``aioprod.MetricsSnapshot``, which does not exist (it is ``aioprod.metrics.MetricsSnapshot``).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[2]
PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]


def documented_names() -> set[tuple[str, str]]:
    """(dotted name, page) for every `aioprod.x.y` in backticks."""
    return {
        (name, page.relative_to(REPO_ROOT).as_posix())
        for page in PAGES
        for name in re.findall(r"`(aioprod(?:\.[A-Za-z_]\w*)+)", page.read_text())
    }


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or a chain of attributes of the longest importable module."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: ModuleType | object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attribute in parts[i:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


def test_every_dotted_name_in_the_docs_exists() -> None:
    names = documented_names()
    assert len(names) > 10  # the pattern still finds them
    missing = sorted(f"{name} ({page})" for name, page in names if not resolves(name))
    assert missing == []
