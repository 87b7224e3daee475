"""docs/spark.md's Python examples, run as written (top to bottom, one namespace) against a real broker."""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.brokers import tansu
from tests.readback import read_topic

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "spark.md"
#: The address the examples write to: `aioprod broker`'s default.
ADDRESS = "127.0.0.1:9092"


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", markdown, flags=re.DOTALL | re.MULTILINE)


def expected_output(block: str) -> list[str] | None:
    """The comment lines that end a block are what it prints; None when they only say "e.g."."""
    lines = block.rstrip("\n").splitlines()
    comments: list[str] = []
    while lines and lines[-1].startswith("# "):
        comments.insert(0, lines.pop()[2:])
    if not comments or comments[0].startswith("e.g. "):
        return None
    return comments


def test_every_python_example_runs_as_written(spark_default_python: Any) -> None:
    blocks = python_blocks(DOC.read_text(encoding="utf-8"))
    assert len(blocks) == 6
    # The session as a user has it (no PYSPARK_PYTHON): the executors example must just work,
    # its tasks on this interpreter rather than on python3 from the PATH.
    with tansu() as broker:
        namespace: dict[str, Any] = {"__name__": "docs_spark_md"}
        for number, block in enumerate(blocks, 1):
            assert ADDRESS in block, f"example {number} writes elsewhere than {ADDRESS}"
            code = compile(block.replace(ADDRESS, broker.bootstrap), f"docs/spark.md, example {number}", "exec")
            with contextlib.redirect_stdout(io.StringIO()) as printed:
                exec(code, namespace)
            expected = expected_output(block)
            if expected is not None:
                assert printed.getvalue().splitlines() == expected, f"example {number} printed otherwise"
        records = read_topic(broker.bootstrap, "orders")
    # Five examples write the three orders (the exactly-once one once, its rerun not at all); the
    # errors example adds its one good row.
    orders = Counter((r.key, r.value) for r in records if r.key is not None)
    assert orders == Counter(
        {
            (b"1", json.dumps({"order_id": 1, "customer": "alice", "amount": 12.5}, separators=(",", ":")).encode()): 5,
            (b"2", json.dumps({"order_id": 2, "customer": "bob", "amount": 3.0}, separators=(",", ":")).encode()): 5,
            (b"3", json.dumps({"order_id": 3, "customer": "alice", "amount": 7.25}, separators=(",", ":")).encode()): 5,
        }
    )
    assert [r.value for r in records if r.key is None] == [b"fine"]
    assert all(r.headers == (("source", b"batch"),) for r in records if r.key is not None)
