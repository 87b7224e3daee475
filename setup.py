"""The optional C extension (everything else is in pyproject.toml).

``aioprod._speedups`` is the compiled hot path (see aioprod/_compiled.py). It is optional: where
it cannot be built (no C compiler, no Python headers) the install goes on and aioprod runs its
pure-Python twins. ``AIOPROD_REQUIRE_SPEEDUPS=1`` makes a failed build an error (CI sets it).
"""

import os

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "aioprod._speedups",
            ["aioprod/_speedups.c"],
            optional=os.environ.get("AIOPROD_REQUIRE_SPEEDUPS", "") in ("", "0"),
            extra_compile_args=["-O2"],
        )
    ]
)
