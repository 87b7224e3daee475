"""The ``aioprod`` command: smoke test, kcat-style produce, perf test, metadata, embedded broker.

``aioprod.cli.main:main`` is the console script; one module per command, and
:mod:`aioprod.cli.common` for what they share (options, errors, the event loop).
"""
