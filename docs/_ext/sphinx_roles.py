"""A griffe extension for the API reference: Sphinx roles in docstrings become code spans.

The docstrings are written for ``help()`` and IDEs, with Sphinx's ``:class:`~aioprod.Producer```
style; Markdown would show the role literally. ``~`` keeps the last dotted component, as
Sphinx does.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|meth|func|attr|mod|exc|data|obj|const):`(~?)([^`]+)`")


def _code(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


class SphinxRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_code, obj.docstring.value)
