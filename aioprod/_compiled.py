"""The compiled hot path (``aioprod/_speedups.c``), when it was built and is not turned off.

Every compiled function or type has a pure-Python twin, which stays the reference: the
extension is optional when installing (no C compiler: the pure-Python path is used), and
``AIOPROD_PURE_PYTHON=1`` in the environment turns it off at import time (the tests run both
ways).
"""

from __future__ import annotations

import os
from types import ModuleType

#: Set to a non-empty value other than "0" to use the pure-Python path only.
PURE_PYTHON_ENV = "AIOPROD_PURE_PYTHON"

speedups: ModuleType | None = None
if os.environ.get(PURE_PYTHON_ENV, "") in ("", "0"):
    try:
        from aioprod import _speedups as speedups
    except ImportError:  # not built (no C compiler at install time): pure Python
        speedups = None

#: The compiled hot path is in use.
COMPILED = speedups is not None
