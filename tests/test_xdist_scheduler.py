"""The suite's xdist scheduler (``pytest_xdist_make_scheduler`` in tests/conftest.py), run on
a small test tree in a child pytest: each test once, the Spark tests on one worker, a crashed
worker reported once, and pytest without xdist or with another ``--dist``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def _pytest(tree: Path, *args: str) -> str:
    """pytest on ``tree`` with the suite's conftest as a plugin; its output (stdout and stderr).
    A run that hangs fails here (TimeoutExpired), not by the suite's own timeout."""
    (tree / "pytest.ini").write_text("[pytest]\n")  # none of the suite's options (its -n 3)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.conftest",
            "--rootdir",
            str(tree),
            "-c",
            str(tree / "pytest.ini"),
        ]
        + [f"-pno:{name}" for name in ("cacheprovider", "hypothesispytest", "anyio", "asyncio", "timeout")]  # seconds
        + [*args, str(tree)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    return result.stdout + result.stderr


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_each_test_runs_once_the_spark_tests_on_one_worker_and_a_crash_is_reported_once(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    seen.mkdir()
    body = (
        "import os, pathlib, pytest\n"
        "@pytest.mark.parametrize('n', range(6))\n"
        "def test_it(n, request):\n"
        "    name = request.node.nodeid.replace('/', '_').replace(':', '_')\n"
        f"    path = pathlib.Path({str(seen)!r}) / name\n"
        "    assert not path.exists()  # run twice\n"
        "    path.write_text(os.environ['PYTEST_XDIST_WORKER'])\n"
    )
    _write(tmp_path / "tests" / "spark" / "test_a.py", body)
    _write(tmp_path / "tests" / "spark" / "test_b.py", body)
    _write(tmp_path / "tests" / "engine" / "test_c.py", body)
    # A test that kills its worker (a segfault in the compiled extension, say). The replacement
    # worker got one test and waited for a second that never came: the run hung for ever. And
    # the crashed test was queued again, to crash worker after worker.
    _write(tmp_path / "tests" / "test_crash.py", "import os\ndef test_crashes_its_worker():\n    os._exit(1)\n")
    output = _pytest(tmp_path, "-n", "2")
    assert "1 failed, 18 passed" in output, output
    assert output.count("node down") == 1, output  # one worker crashed: the test ran once
    workers = {path.name: path.read_text() for path in seen.iterdir()}
    assert len(workers) == 18
    assert len({worker for name, worker in workers.items() if name.startswith("tests_spark_")}) == 1


def test_without_xdist_the_hook_is_no_error(tmp_path: Path) -> None:
    # "-p no:xdist": the conftest's xdist hook was an unknown hook, an INTERNALERROR.
    _write(tmp_path / "tests" / "test_one.py", "def test_one(): pass\n")
    output = _pytest(tmp_path, "-p", "no:xdist")
    assert "1 passed" in output, output


def test_another_dist_mode_asked_for_is_xdists(tmp_path: Path) -> None:
    # --dist each runs every test on every worker; the conftest's scheduler took its place.
    _write(tmp_path / "tests" / "test_one.py", "def test_one(): pass\n")
    output = _pytest(tmp_path, "-n", "2", "--dist", "each")
    assert "2 passed" in output, output
