"""``aioprod produce``: lines in, records out, read back with confluent_kafka."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from aioprod.cli.produce import FailedLines
from tests.brokers import TansuBroker
from tests.cli.conftest import aioprod, create_topic, full_buffer_after, read_until, spawn
from tests.readback import read_topic

pytestmark = pytest.mark.integration


def test_file_with_keys_and_headers(bootstrap: str, topic: str, tmp_path: Path) -> None:
    data = tmp_path / "records.txt"
    data.write_bytes(b"k1:v1\r\nk2:v:with:colons\nno separator\n:empty key\n\nlast-without-newline:x")
    result = aioprod("produce", topic, str(data), "-b", bootstrap, "-K", ":", "-H", "source=cli", "-H", "n=2")
    assert result.exit_code == 0, result.output
    assert "6 records produced" in result.stderr
    records = read_topic(bootstrap, topic)
    assert sorted(((r.key, r.value) for r in records), key=repr) == sorted(
        [
            (b"k1", b"v1"),
            (b"k2", b"v:with:colons"),
            (None, b"no separator"),  # as kcat: no separator, no key
            (b"", b"empty key"),
            (None, b""),  # an empty line is an empty record
            (b"last-without-newline", b"x"),
        ],
        key=repr,
    )
    assert {r.headers for r in records} == {(("source", b"cli"), ("n", b"2"))}


def test_stdin_in_order_to_one_partition(bootstrap: str, topic: str) -> None:
    create_topic(bootstrap, topic, partitions=3)
    lines = [f"line {i}" for i in range(50)]
    result = aioprod("produce", topic, "-", "-b", bootstrap, "--partition", "2", input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    records = read_topic(bootstrap, topic)
    assert {r.partition for r in records} == {2}
    assert [r.value for r in sorted(records, key=lambda r: r.offset)] == [line.encode() for line in lines]
    assert all(r.key is None and r.headers == () for r in records)


def test_a_failing_line_is_reported_and_the_others_still_go(bootstrap: str, topic: str) -> None:
    too_big = "x" * 5000
    result = aioprod("produce", topic, "-b", bootstrap, "-X", "max.request.size=2000", input=f"ok 1\n{too_big}\nok 3\n")
    assert result.exit_code == 1
    assert "line 2: RecordTooLargeError: a line of 5,000 bytes makes a record larger than max_request_size (2,000)" in (
        result.stderr
    )
    assert "line 1" not in result.stderr and "line 3" not in result.stderr
    assert result.stderr.splitlines()[-1] == f"aioprod: error: 2 records produced to '{topic}'; 1 failed (lines above)"
    assert sorted(r.value for r in read_topic(bootstrap, topic)) == [b"ok 1", b"ok 3"]


def test_lines_failing_alike_one_after_another_are_said_once(bootstrap: str, topic: str) -> None:
    # A broker gone for good, or a second Ctrl-C abandoning what was queued, printed one line per
    # record: 9,727 identical lines before the summary, in a run by hand.
    too_big = "x" * 5000
    result = aioprod(
        "produce", topic, "-b", bootstrap, "-X", "max.request.size=2000", input=f"{too_big}\n" * 5 + "ok\n"
    )
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "line 1: RecordTooLargeError: a line of 5,000 bytes makes a record larger than max_request_size (2,000) allows",
        "lines 2-5: the same",
        f"aioprod: error: 1 record produced to '{topic}'; 5 failed (lines above)",
    ]


def test_failed_lines_say_a_run_once_with_the_lines_it_spans() -> None:
    said: list[str] = []
    lines = FailedLines(said.append)
    for number, error in [(1, "E: a"), (2, "E: a"), (3, "F: b"), (4, "E: a"), (6, "E: a"), (9, "E: a")]:
        lines.fail(number, error)
    lines.end_run()
    lines.end_run()  # nothing more to say
    assert said == [
        "line 1: E: a",
        "line 2: E: a",
        "line 3: F: b",
        "line 4: E: a",
        "2 more lines from 6 to 9: the same",
    ]


def test_a_partition_that_does_not_exist_is_one_usage_error(bootstrap: str, topic: str) -> None:
    create_topic(bootstrap, topic, partitions=1)
    result = aioprod("produce", topic, "-b", bootstrap, "-p", "7", input="a\nb\n")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"aioprod: error: --partition 7: partition 7 does not exist: topic {topic!r} has 1 partition (0-0)"
    ]


def test_bootstrap_from_the_environment(bootstrap: str, topic: str) -> None:
    result = aioprod("produce", topic, input="from env\n", env={"AIOPROD_BOOTSTRAP_SERVERS": bootstrap})
    assert result.exit_code == 0, result.output
    assert [r.value for r in read_topic(bootstrap, topic)] == [b"from env"]


def test_the_topic_may_be_given_with_t_as_kcat_and_the_console_producer_spell_it(
    bootstrap: str, topic: str, tmp_path: Path
) -> None:
    # `-t TOPIC` was "No such option: -t", the only command of the four without it.
    from_file = tmp_path / "lines.txt"
    from_file.write_text("from the file\n")
    assert aioprod("produce", "-t", topic, "-b", bootstrap, input="from stdin\n").exit_code == 0
    assert aioprod("produce", "--topic", topic, str(from_file), "-b", bootstrap).exit_code == 0
    assert sorted(r.value for r in read_topic(bootstrap, topic)) == [b"from stdin", b"from the file"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((), "no topic: aioprod produce TOPIC [FILE], or -t TOPIC"),
        (("a", "-", "-t", "b"), "two topics: 'a' and -t 'b'"),
        (("-t", "bad topic"), "--topic"),
    ],
)
def test_a_topic_missing_or_given_twice_is_a_usage_error(args: tuple[str, ...], said: str) -> None:
    result = aioprod("produce", *args, "-b", "127.0.0.1:9", input="x\n")
    assert result.exit_code == 2
    assert said in result.stderr


def test_no_bootstrap_is_a_usage_error() -> None:
    result = aioprod("produce", "t", input="x\n")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "aioprod: error: no bootstrap servers: pass -b HOST:PORT or set AIOPROD_BOOTSTRAP_SERVERS"
    )


def test_malformed_header_is_a_usage_error() -> None:
    result = aioprod("produce", "t", "-b", "127.0.0.1:9", "-H", "novalue", input="x\n")
    assert result.exit_code == 2
    assert "--header 'novalue': expected KEY=VALUE" in result.stderr


def test_delimiter_fixed_key_and_empty_as_null(bootstrap: str, topic: str) -> None:
    """Point 7: -D splits records, -k keys them all, -Z sends an empty value as null (as kcat)."""
    result = aioprod("produce", topic, "-b", bootstrap, "-D", "\\0", "-k", "fixed", "-Z", input=b"a\nb\0\0last")
    assert result.exit_code == 0, result.output
    records = sorted(read_topic(bootstrap, topic), key=lambda r: (r.partition, r.offset))
    assert sorted((r.key, r.value) for r in records if r.value is not None) == [
        (b"fixed", b"a\nb"),
        (b"fixed", b"last"),
    ]
    assert [(r.key, r.value) for r in records if r.value is None] == [(b"fixed", None)]


def test_headers_on_each_line(bootstrap: str, topic: str) -> None:
    """Point 7: --parse-headers reads HEADERS<TAB>KEY:VALUE lines, as kafka-console-producer does."""
    lines = "trace:abc,flag\tk1:v1\n\tk2:v2\n"  # a header without ':' has a null value; no headers at all
    result = aioprod("produce", topic, "-b", bootstrap, "--parse-headers", "-K", ":", "-H", "source=cli", input=lines)
    assert result.exit_code == 0, result.output
    got = {(r.key, r.value): r.headers for r in read_topic(bootstrap, topic)}
    assert got == {
        (b"k1", b"v1"): (("source", b"cli"), ("trace", b"abc"), ("flag", None)),
        (b"k2", b"v2"): (("source", b"cli"),),
    }
    bad = aioprod("produce", topic, "-b", bootstrap, "--parse-headers", input="no tab here\n")
    assert bad.exit_code == 1
    assert "line 1: ValueError: no headers delimiter" in bad.stderr


def test_report_line_per_record(bootstrap: str, topic: str) -> None:
    """Point 7: --report prints one JSON line per record: where it landed, or why it failed."""
    too_big = "x" * 5000
    result = aioprod(
        "produce", topic, "-b", bootstrap, "--report", "-X", "max.request.size=2000", input=f"a\n{too_big}\nb\n"
    )
    assert result.exit_code == 1
    reports = {r["line"]: r for r in map(json.loads, result.stdout.splitlines())}
    assert sorted(reports) == [1, 2, 3]
    assert reports[2]["error"].startswith("RecordTooLargeError")
    stored = {(r.partition, r.offset): r.value for r in read_topic(bootstrap, topic)}
    for line, value in ((1, b"a"), (3, b"b")):
        assert reports[line]["topic"] == topic
        assert stored[(reports[line]["partition"], reports[line]["offset"])] == value


def test_config_file_environment_and_x_in_that_order(bootstrap: str, topic: str, tmp_path: Path) -> None:
    """Point 7: -F (Java .properties) < AIOPROD_<OPTION> < -X; the file may name the brokers."""
    config = tmp_path / "client.properties"
    config.write_text(
        f"# as for kafka-console-producer --producer.config\nbootstrap.servers={bootstrap}\nmax.request.size : 2000\n"
    )
    big = "x" * 5000 + "\n"
    from_file = aioprod("produce", topic, "-F", str(config), input=big)
    assert from_file.exit_code == 1 and "RecordTooLargeError" in from_file.stderr
    from_env = aioprod("produce", topic, "-F", str(config), input=big, env={"AIOPROD_MAX_REQUEST_SIZE": "100000"})
    assert from_env.exit_code == 0, from_env.output
    from_x = aioprod(
        "produce", topic, "-F", str(config), "-X", "max.request.size=2000", input=big,
        env={"AIOPROD_MAX_REQUEST_SIZE": "100000"},
    )  # fmt: skip
    assert from_x.exit_code == 1 and "RecordTooLargeError" in from_x.stderr
    assert len(read_topic(bootstrap, topic)) == 1
    via_env = aioprod("produce", topic, input="y\n", env={"AIOPROD_CONFIG_FILE": str(config)})
    assert via_env.exit_code == 0, via_env.output
    config.write_text("linger.mss=5\n")
    typo = aioprod("produce", topic, "-b", bootstrap, "-F", str(config), input="x\n")
    assert typo.exit_code == 2
    assert typo.stderr == (
        f"aioprod: error: bad producer option ({config}:1): unknown option 'linger.mss' (did you mean 'linger.ms'?)\n"
    )


def test_verbose_logging(bootstrap: str, topic: str) -> None:
    """Point 7: -v logs INFO (the options given, and where from), -vv DEBUG too; secrets never."""
    env = {"AIOPROD_LINGER_MS": "7"}
    quiet = aioprod("produce", topic, "-b", bootstrap, "-X", "acks=1", input="x\n", env=env)
    assert quiet.exit_code == 0 and quiet.stderr == "aioprod: 1 record produced to '" + topic + "'\n"
    info = aioprod("-v", "produce", topic, "-b", bootstrap, "-X", "acks=1", input="x\n", env=env)
    assert info.exit_code == 0, info.output
    assert re.search(r"INFO +aioprod\.cli\.common: option linger_ms=7 \(\$AIOPROD_LINGER_MS\)", info.stderr)
    assert re.search(r"INFO +aioprod\.cli\.common: option acks=1 \(-X acks\)", info.stderr)
    assert "DEBUG" not in info.stderr
    debug = aioprod("produce", topic, "-b", bootstrap, "-vv", input="x\n", env=env)
    assert re.search(r"DEBUG +aioprod\.cli\.common: producer options: .*linger_ms=7", debug.stderr)


_INPUT_AFTER_THE_LOOP = """
import asyncio, os, threading
from aioprod.cli.produce import read_chunks

read_end, write_end = os.pipe()
stream = os.fdopen(read_end, "rb")

async def first_chunk() -> None:
    async for chunk in read_chunks(stream):
        assert chunk == b"first"
        return

os.write(write_end, b"first")
asyncio.run(first_chunk())  # the command ends (Ctrl-C, say); its loop is closed
os.write(write_end, b"late")  # input the reading thread still takes, with nobody to give it to
os.close(write_end)
for thread in threading.enumerate():
    if thread.name == "aioprod-input":
        thread.join()
print("done")
"""


def test_input_read_after_the_command_ended_leaves_no_warning() -> None:
    # The thread reading the input hands each chunk to the loop. Input arriving after the loop
    # closed (Ctrl-C, then the shell closing the pipe) had left a coroutine never awaited, and
    # Python's "RuntimeWarning: coroutine 'Queue.put' was never awaited" after the command's
    # last line.
    result = subprocess.run([sys.executable, "-c", _INPUT_AFTER_THE_LOOP], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (0, "done\n", "")


def test_report_into_a_closed_pipe_stops_reporting_with_one_warning(tansu_broker: TansuBroker, topic: str) -> None:
    """`aioprod produce --report | head -2`: no traceback per remaining record."""
    command = (
        f"seq 1 5000 | {sys.executable} -m aioprod.cli produce {topic} -b {tansu_broker.bootstrap} --report"
        " | head -2 >/dev/null"
    )
    run = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in run.stderr
    assert "standard output closed: no more delivery reports" in run.stderr
    assert len(run.stderr.splitlines()) <= 3, run.stderr[-1500:]
    assert len(read_topic(tansu_broker.bootstrap, topic)) == 5000  # producing went on


def test_a_java_client_properties_file_runs_with_its_foreign_options_skipped(
    tansu_broker: TansuBroker, topic: str, tmp_path: Path
) -> None:
    """Confluent Cloud's Java client.properties carries a consumer's option and a Java-only one
    (client.dns.lookup=use_all_dns_ips, Java's default, is what aioprod does: taken)."""
    properties = tmp_path / "client.properties"
    properties.write_text(
        f"bootstrap.servers={tansu_broker.bootstrap}\n"
        "# Required for correctness in Apache Kafka clients prior to 2.6\n"
        "client.dns.lookup=use_all_dns_ips\n"
        "session.timeout.ms=45000\n"
        "acks=all\n"
        "key.serializer=org.apache.kafka.common.serialization.StringSerializer\n"
    )
    result = aioprod("produce", topic, "-F", str(properties), input="hi\n")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.splitlines()[:2] == [
        f"aioprod: warning: {properties}:4: skipped: option 'session.timeout.ms' is a consumer option (aioprod is a "
        "producer)",
        f"aioprod: warning: {properties}:6: skipped: option 'key_serializer' names a Java class "
        "(org.apache.kafka.common.serialization.StringSerializer): give aioprod a callable",
    ]
    assert [r.value for r in read_topic(tansu_broker.bootstrap, topic)] == [b"hi"]


def test_a_foreign_option_given_with_x_is_a_usage_error() -> None:
    result = aioprod("produce", "t", "-b", "127.0.0.1:9", "-X", "session.timeout.ms=45000", input="x\n")
    assert result.exit_code == 2
    assert "bad producer option (-X session.timeout.ms): option 'session.timeout.ms' is a consumer option" in (
        result.stderr
    )


def test_an_explicit_newline_delimiter_keeps_a_trailing_cr(bootstrap: str, topic: str) -> None:
    result = aioprod("produce", topic, "-b", bootstrap, "-D", "\\n", "-p", "0", input=b"a\r\nb\r\n")
    assert result.exit_code == 0, result.stderr
    assert [r.value for r in sorted(read_topic(bootstrap, topic), key=lambda r: r.offset)] == [b"a\r", b"b\r"]


def test_flag_values_that_are_not_utf8_are_the_bytes_given(bootstrap: str, topic: str) -> None:
    # Python hands argv bytes that are not UTF-8 over as lone surrogates: .encode() raised.
    args = ["-K", "\udcff", "-D", "\udca7", "-k", "\udcfe", "-H", "h=\udce9", "-p", "0"]
    result = aioprod("produce", topic, "-b", bootstrap, *args, input=b"k\xffv\xa7w\xa7")
    assert result.exit_code == 0, result.stderr
    records = sorted(read_topic(bootstrap, topic), key=lambda r: r.offset)
    assert [(r.key, r.value, r.headers) for r in records] == [
        (b"k", b"v", (("h", b"\xe9"),)),
        (b"\xfe", b"w", (("h", b"\xe9"),)),
    ]


def test_a_send_that_fails_stops_at_its_line_and_says_what_became_of_the_lines_before(
    bootstrap: str, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    full_buffer_after(monkeypatch, 3)
    result = aioprod("produce", topic, "-b", bootstrap, input="".join(f"line {i}\n" for i in range(1, 10)))
    assert result.exit_code == 1
    assert (
        "stopped at line 4: KafkaTimeoutError: buffer_memory stayed full for max_block_ms; "
        "lines before it: 3 records delivered, 0 failed, 0 unsent"
    ) in result.stderr
    assert sorted(r.value for r in read_topic(bootstrap, topic)) == [b"line 1", b"line 2", b"line 3"]


def test_errors_into_a_closed_pipe_stop_neither_the_producing_nor_the_exit_code(bootstrap: str, topic: str) -> None:
    """`aioprod produce t < lines 2>&1 | head -1`: the next failing line's message met a closed
    stderr, and the BrokenPipeError ended the command there, the rest of the input never sent."""
    proc = spawn("produce", topic, "-b", bootstrap, "-X", "max.request.size=1500", "-p", "0")
    assert proc.stdin is not None and proc.stderr is not None
    proc.stdin.write("x" * 2000 + "\n")
    proc.stdin.flush()
    read_until(proc.stderr, lambda line: line.startswith("line 1: RecordTooLargeError"))
    proc.stderr.close()  # the reader went away
    proc.stdin.write("y" * 2000 + "\n" + "".join(f"ok {i}\n" for i in range(3, 23)))
    proc.stdin.close()
    assert proc.wait(timeout=60) == 1  # lines 1 and 2 failed
    values = [r.value for r in sorted(read_topic(bootstrap, topic), key=lambda r: r.offset)]
    assert values == [f"ok {i}".encode() for i in range(3, 23)]


def test_a_success_whose_stderr_reader_went_away_still_exits_0(bootstrap: str, topic: str) -> None:
    """Its summary line met a closed stderr: exit code 1, for records all delivered."""
    proc = spawn("produce", topic, "-b", bootstrap)
    assert proc.stdin is not None and proc.stderr is not None
    proc.stderr.close()
    proc.stdin.write("a\nb\n")
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0
    assert sorted(r.value for r in read_topic(bootstrap, topic)) == [b"a", b"b"]
