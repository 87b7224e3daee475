"""What every command shares: -X validation, exit codes, --debug, --help, latency stats."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import pytest

from aioprod.cli.common import run
from tests.brokers import refused_port
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


@pytest.mark.parametrize(
    "item",
    [
        "sasl.password HUNTER2",
        "sasl.password:HUNTER2",
        "ssl.key.password:HUNTER2",
        "sasl.password HUNTER2==",  # a base64 secret's '=' is not the separator
        "sasl.oauthbearer.client.secret:HUNTER2=x",
    ],
)
def test_a_malformed_secret_option_is_refused_without_its_value(item: str) -> None:
    # The other separators a .properties file takes: the refusal quoted the password.
    result = aioprod("metadata", "-b", "127.0.0.1:9", "-X", item)
    assert result.exit_code == 2 and "expected KEY=VALUE" in result.stderr
    assert "HUNTER2" not in result.output + result.stderr


@pytest.mark.parametrize("command", [["produce", "t"], ["smoke"], ["perf", "-t", "t", "-n", "1", "-s", "1"]])
def test_a_transactional_id_is_refused_before_anything_starts(command: list[str]) -> None:
    # The commands run no transactions: the producer initialised one, then every line failed.
    result = aioprod(*command, "-b", "127.0.0.1:9", "-X", "transactional.id=x", input="x\n")
    assert result.exit_code == 2
    assert result.stderr == (
        "aioprod: error: transactional.id is not supported here: the commands do not run transactions\n"
    )


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
    failing = ["metadata", "-b", f"127.0.0.1:{refused_port()}", "-X", "max.block.ms=300"]
    plain = aioprod(*failing)
    assert plain.exit_code == 1 and "Traceback" not in plain.stderr
    args = ["--debug", *failing] if where == "before" else [*failing, "--debug"]
    debug = aioprod(*args)
    assert debug.exit_code == 1
    assert "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.splitlines()[-1] == plain.stderr.splitlines()[-1]  # the same one-line error, last


def test_debug_from_the_environment() -> None:
    result = aioprod(
        "metadata", "-b", f"127.0.0.1:{refused_port()}", "-X", "max.block.ms=300", env={"AIOPROD_DEBUG": "1"}
    )
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


@pytest.mark.integration
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["smoke", "--recrods", "5"], "No such option '--recrods'. (Did you mean one of: '--records'"),
        (["smok"], "No such command 'smok'. Did you mean 'smoke'?"),
        (["perf", "-n", "10", "-s", "1"], "Missing option '-t' / '--topic'."),
        (["perf", "-t", "t", "-n", "many", "-s", "1"], "Invalid value for '-n' / '--num-records': 'many'"),
        (["produce"], "no topic: aioprod produce TOPIC [FILE], or -t TOPIC"),
        (["produce", "a b"], "Invalid value for '[TOPIC]': illegal topic name 'a b'"),
        (["perf", "-t", "", "-n", "1", "-s", "1"], "Invalid value for '-t' / '--topic': topic name is empty"),
        (["smoke", "-t", "x" * 250], "Invalid value for '-t' / '--topic': topic name is 250 characters long"),
    ],
    ids=[
        "unknown-flag",
        "unknown-command",
        "missing-option",
        "bad-value",
        "missing-argument",
        "illegal-topic",
        "empty-topic",
        "long-topic",
    ],
)
def test_usage_errors_are_one_line_with_did_you_mean(bootstrap: str, args: list[str], expected: str) -> None:
    """Point 3: click's usage errors in the documented form: one ``aioprod: error:`` line, exit 2."""
    result = aioprod(*args, env={"AIOPROD_BOOTSTRAP_SERVERS": bootstrap}, input="")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"aioprod: error: {expected}")
    assert result.stderr.rstrip().endswith("--help')")  # and where to read more


def test_did_you_mean_answers_in_the_spelling_asked() -> None:
    """Point 8: a dotted (Java) name gets a dotted suggestion, a snake one a snake suggestion."""
    dotted = aioprod("perf", "-t", "t", "-n", "1", "-s", "1", "-X", "linger.mss=5")
    assert "did you mean 'linger.ms'?" in dotted.stderr
    snake = aioprod("perf", "-t", "t", "-n", "1", "-s", "1", "-X", "linger_mss=5")
    assert "did you mean 'linger_ms'?" in snake.stderr


def test_help_links_the_documentation_site() -> None:
    """Point 8: pip users have no docs/ folder: the epilogue links the site's CLI page."""
    import importlib.metadata

    result = aioprod("--help")
    assert "docs/cli.md" not in result.stdout
    site = dict(url.split(", ", 1) for url in importlib.metadata.metadata("aioprod").get_all("Project-URL") or [])
    assert f"Documentation: {site['Documentation'].rstrip('/')}/cli/" in result.stdout


def test_every_option_has_an_environment_variable() -> None:
    """Point 7: AIOPROD_<OPTION> for each -X option (shown by -v with where each came from)."""
    import dataclasses

    from aioprod.cli.common import ENV_OPTIONS
    from aioprod.config import ProducerConfig

    defaults = {f.name: f.default for f in dataclasses.fields(ProducerConfig)}
    samples = {
        "transactional_id": "txn",
        "compression_level": "1",
        "compression_type": "gzip",
        "sasl_mechanism": "PLAIN",
        "sasl_password": "hunter2-sasl",
        "ssl_key_password": "hunter2-key",
        "sasl_jaas_config": "hunter2-jaas",
        "compression_gzip_level": "1",
        "compression_lz4_level": "1",
        "compression_zstd_level": "1",
    }
    env = {}
    for name in ENV_OPTIONS:
        if name == "bootstrap_servers":
            continue
        default = defaults.get(name)
        value = str(default).lower() if isinstance(default, bool) else "x" if default is None else str(default)
        env[f"AIOPROD_{name.upper()}"] = samples.get(name, value)
    result = aioprod("-v", "metadata", "-b", f"127.0.0.1:{refused_port()}", env={**env, "AIOPROD_MAX_BLOCK_MS": "200"})
    assert result.exit_code != 0  # nothing listens (and transactions may be refused): only the options matter here
    for variable in env:
        assert f"(${variable})" in result.stderr, variable
    assert "hunter2" not in result.stderr  # secrets are logged as <hidden>


@pytest.mark.parametrize(
    ("args", "env", "where"),
    [
        (["-X", "linger.ms=-1"], None, "(-X linger.ms)"),
        (["-X", "compression.type=lz5"], None, "(-X compression.type)"),
        (["-X", "batch.size=-5"], None, "(-X batch.size)"),
        (["-X", "compression.type=zstd", "-X", "compression.level=99"], None, "(-X compression.level)"),
        ([], {"AIOPROD_LINGER_MS": "-1"}, "($AIOPROD_LINGER_MS)"),
        # argv bytes that are not UTF-8: an untyped UnicodeEncodeError, exit code 1, naming no option
        (["-X", "client.id=app-\udcff"], None, "(-X client.id)"),
    ],
)
def test_a_value_out_of_range_says_where_it_came_from(args: list[str], env: dict[str, str] | None, where: str) -> None:
    result = aioprod("produce", "t", "-b", "127.0.0.1:9", *args, input="x\n", env=env)
    assert result.exit_code == 2
    assert f"aioprod: error: bad producer option {where}: " in result.stderr


def test_a_value_out_of_range_in_a_properties_file_names_its_line(tmp_path: Path) -> None:
    properties = tmp_path / "client.properties"
    properties.write_text("# producer\ncompression.type=lz5\n")
    result = aioprod("produce", "t", "-b", "127.0.0.1:9", "-F", str(properties), input="x\n")
    assert result.exit_code == 2
    assert f"bad producer option ({properties}:2): " in result.stderr


def test_a_codec_level_variable_is_read_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    # Java's per-codec level names are options: their variables were neither used nor refused.
    from aioprod.cli.common import ClientOptions, CliUsageError

    monkeypatch.setenv("AIOPROD_COMPRESSION_TYPE", "gzip")
    monkeypatch.setenv("AIOPROD_COMPRESSION_GZIP_LEVEL", "12")
    with pytest.raises(CliUsageError, match="AIOPROD_COMPRESSION_GZIP_LEVEL"):
        ClientOptions(None, None, ()).producer_options("h:9092")


class InterruptedRunner:
    """A fake asyncio.Runner: Ctrl-C lands while the command's event loop is being set up."""

    def __init__(self, **_options: object) -> None:
        raise KeyboardInterrupt


def test_a_ctrl_c_before_the_loop_runs_the_command_leaves_no_coroutine_never_awaited(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # It left "RuntimeWarning: coroutine 'run_perf' was never awaited" after the command's last line.
    async def command() -> None:
        raise AssertionError("never run")

    coroutine = command()
    monkeypatch.setattr(asyncio, "Runner", InterruptedRunner)
    with pytest.raises(KeyboardInterrupt):
        run(coroutine)
    assert inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED
