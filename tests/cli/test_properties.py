"""Java .properties files (``-F``), read as ``java.util.Properties.load`` reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from aioprod.cli.properties import PropertiesError, load_properties, parse_properties
from tests.cli.conftest import aioprod


def test_separators_comments_and_blank_lines() -> None:
    text = "# comment\n! also a comment\n\n  a=1\nb: 2\nc 3\nd\t=\t4\ne =\nf\n"
    assert [(k, v) for k, v, _ in parse_properties(text)] == [
        ("a", "1"),
        ("b", "2"),
        ("c", "3"),
        ("d", "4"),
        ("e", ""),
        ("f", ""),
    ]


def test_continuations_escapes_and_line_numbers() -> None:
    text = (
        "sasl.jaas.config=first \\\n"
        "    second\n"
        "key\\ with\\ spaces = tab\\there\n"
        "unicode=caf\\u00e9\n"
        "a\\=b=c\n"
        "odd=one\\\\\n"
        "next=x\n"
    )
    assert parse_properties(text) == [
        ("sasl.jaas.config", "first second", 1),
        ("key with spaces", "tab\there", 3),
        ("unicode", "café", 4),
        ("a=b", "c", 5),
        ("odd", "one\\", 6),  # an even number of backslashes does not continue the line
        ("next", "x", 7),
    ]


def test_errors_name_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.properties"
    path.write_text("ok=1\nbad=\\u12\n")
    with pytest.raises(PropertiesError, match=r"bad\.properties:2: malformed \\uXXXX escape"):
        load_properties(path)
    with pytest.raises(PropertiesError, match="cannot read"):
        load_properties(tmp_path / "missing.properties")


@pytest.mark.parametrize("line", ["acks=all ", "enable.idempotence=true ", "compression.type=lz4 "])
def test_a_trailing_blank_in_a_properties_value_is_trimmed(tmp_path: Path, line: str) -> None:
    # Invisible in an editor, and trimmed by Java's tools: "bad producer option", exit code 2.
    config = tmp_path / "client.properties"
    config.write_text(f"bootstrap.servers=127.0.0.1:1\nlinger.ms=5 \n{line}\n")
    result = aioprod("metadata", "-F", str(config), "-X", "max.block.ms=200")
    assert "bad producer option" not in result.stderr and result.exit_code != 2, result.stderr


def test_a_kcat_config_file_with_a_consumer_option_skips_it(tmp_path: Path) -> None:
    config = tmp_path / "kcat.conf"
    config.write_text("bootstrap.servers=127.0.0.1:1\nenable.partition.eof=false\n")
    result = aioprod("metadata", "-F", str(config), "-X", "max.block.ms=200")
    assert f"{config}:2: skipped: option 'enable.partition.eof' is a consumer option" in result.stderr
    assert result.exit_code != 2, result.stderr


def test_an_aioprod_variable_that_names_no_option_is_warned_about() -> None:
    # AIOPROD_MESSAGE_TIMEOUT_MS=1 (librdkafka's name) changed nothing and said nothing.
    result = aioprod("metadata", "-b", "127.0.0.1:1", "-X", "max.block.ms=200", env={"AIOPROD_MESSAGE_TIMEOUT_MS": "1"})
    assert result.stderr.count("$AIOPROD_MESSAGE_TIMEOUT_MS is not an option aioprod reads") == 1, result.stderr


def test_a_lower_case_aioprod_variable_is_warned_about() -> None:
    # Only AIOPROD_<NAME> in upper case is read: AIOPROD_linger_ms was neither read nor warned about.
    result = aioprod("metadata", "-b", "127.0.0.1:1", "-X", "max.block.ms=200", env={"AIOPROD_linger_ms": "oops"})
    assert "$AIOPROD_linger_ms is not an option aioprod reads" in result.stderr, result.stderr


def test_what_the_configuration_says_is_said_once() -> None:
    # The CLI validates the options, then the producer builds them again: said twice.
    result = aioprod(
        "metadata", "-b", "127.0.0.1:1", "-X", "max.block.ms=200", "-X", "max.in.flight.requests.per.connection=10"
    )
    assert result.stderr.count("idempotence turned off") == 1, result.stderr


@pytest.mark.integration
@pytest.mark.parametrize(
    "args", [("produce", "TOPIC"), ("smoke", "-n", "5", "-t", "TOPIC"), ("perf", "-t", "TOPIC", "-n", "5", "-s", "5")]
)
def test_what_the_configuration_says_is_said_once_by_each_command(
    bootstrap: str, topic: str, args: tuple[str, ...]
) -> None:
    # The topic check, the smoke probe and perf's size check built the config again: the
    # warning came two to four times.
    args = tuple(topic if a == "TOPIC" else a for a in args)
    result = aioprod(*args, "-b", bootstrap, "-X", "max.in.flight.requests.per.connection=10", input="x\n")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.count("idempotence turned off") == 1, result.stderr


def test_a_malformed_escape_in_a_secret_is_not_quoted() -> None:
    # A backslash in a password ("Pa55\\user-..."): the error quoted the characters after it.
    with pytest.raises(PropertiesError) as info:
        parse_properties("security.protocol=SASL_SSL\nsasl.password=Pa55\\user-Kx9\n", "client.properties")
    assert str(info.value) == "client.properties:2: sasl.password: malformed \\uXXXX escape (value hidden)"
