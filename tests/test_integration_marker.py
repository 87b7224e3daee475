"""``-m "not integration"`` starts no broker: the guard in ``tests/conftest.py`` fails any test
that would, however it starts one (a fixture, ``EmbeddedBroker``, a child process, the mock
cluster). The cases run in one inner pytest session, in a child process, with the suite's own
conftest."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

REPO_ROOT = Path(__file__).resolve().parent.parent

INNER_TESTS = """
import subprocess
import sys

import pytest

from aioprod.embedded import EmbeddedBroker
from tests.brokers import mock_cluster


@pytest.fixture
def my_broker(tansu_broker):
    return tansu_broker


def test_fixture(tansu_broker):
    pass


def test_fixture_through_another(my_broker):
    pass


def test_in_process():
    EmbeddedBroker().start()


def test_child_process():
    subprocess.run([sys.executable, "-m", "aioprod.cli", "smoke", "-n", "1"], check=False, capture_output=True)


def test_mock_cluster():
    with mock_cluster(1):
        pass


@pytest.mark.integration
def test_marked_is_left_alone():
    import os

    import aioprod.embedded

    assert "CALF_TANSU_BIN" not in os.environ
    assert aioprod.embedded.broker_binary.__module__ == "aioprod.embedded"
"""

#: test name → (how it fails: at setup or teardown "ERROR", in the test "FAILED"; the message)
EXPECTED = {
    "test_fixture": ("ERROR", "uses the broker fixture tansu_broker"),
    "test_fixture_through_another": ("ERROR", "uses the broker fixture tansu_broker"),
    "test_in_process": ("FAILED", "this test starts the embedded Tansu broker"),
    "test_child_process": ("ERROR", "a child process of this test started the Tansu broker"),
    "test_mock_cluster": ("FAILED", "this test starts librdkafka's mock cluster"),
}


def test_an_unmarked_test_starting_a_broker_fails(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest("from tests.conftest import *  # noqa: F403 - the suite's hooks and fixtures\n")
    pytester.makeini(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\nmarkers =\n    integration: starts a broker\n"
    )
    pytester.makepyfile(test_inner=INNER_TESTS)
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    monkeypatch.delenv("CALF_TANSU_BIN")  # this test's own guard: the inner session sets its own
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rfE")
    # The child-process test passes its call, then fails at teardown: passed 2 with the marked one.
    result.assert_outcomes(passed=2, failed=2, errors=3)
    for name, (kind, message) in EXPECTED.items():
        result.stdout.fnmatch_lines([f"{kind} test_inner.py::{name} *"])
        result.stdout.fnmatch_lines([f"*{message}, but the test is not marked integration*"])
