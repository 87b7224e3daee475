"""What every command shares: -X validation, exit codes, --debug, --help, latency stats."""

from __future__ import annotations

import pytest

from aioprod.embedded import free_port
from tests.cli.conftest import aioprod


@pytest.mark.parametrize(
    ("option", "named"),
    [("linger.mss=5", "linger.mss"), ("acks=7", "acks"), ("batch.size=big", "batch_size"), ("nonsense", "nonsense")],
)
def test_bad_x_option_is_a_one_line_usage_error(option: str, named: str) -> None:
    result = aioprod("produce", "t", "-b", "127.0.0.1:9", "-X", option, input="x\n")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("aioprod: error: ")
    assert named in result.stderr


def test_bootstrap_given_twice_is_a_usage_error() -> None:
    result = aioprod("metadata", "-b", "a:1", "-X", "bootstrap.servers=b:2")
    assert result.exit_code == 2
    assert "given twice" in result.stderr


@pytest.mark.integration
def test_x_bootstrap_servers_is_a_bootstrap(bootstrap: str) -> None:
    result = aioprod("metadata", "-X", f"bootstrap.servers={bootstrap}")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback(where: str) -> None:
    failing = ["metadata", "-b", f"127.0.0.1:{free_port()}", "-X", "max.block.ms=300"]
    plain = aioprod(*failing)
    assert plain.exit_code == 1 and "Traceback" not in plain.stderr
    args = ["--debug", *failing] if where == "before" else [*failing, "--debug"]
    debug = aioprod(*args)
    assert debug.exit_code == 1
    assert "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.splitlines()[-1] == plain.stderr.strip()  # the same one-line message, last


def test_debug_from_the_environment() -> None:
    result = aioprod("metadata", "-b", f"127.0.0.1:{free_port()}", env={"AIOPROD_DEBUG": "1"})
    assert "Traceback" in result.stderr


@pytest.mark.parametrize("command", ["smoke", "produce", "perf", "metadata", "broker"])
def test_help_has_examples(command: str) -> None:
    result = aioprod(command, "--help")
    assert result.exit_code == 0
    assert "Examples:" in result.stdout
    assert f"aioprod {command}" in result.stdout


def test_top_level_help_documents_exit_codes_and_environment() -> None:
    result = aioprod("--help")
    assert result.exit_code == 0
    for text in ("Exit codes:", "130", "usage error", "AIOPROD_BOOTSTRAP_SERVERS", "-X key=value"):
        assert text in result.stdout


def test_unknown_flag_is_click_usage_error() -> None:
    assert aioprod("smoke", "--no-such-flag").exit_code == 2
