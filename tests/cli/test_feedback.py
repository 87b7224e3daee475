"""What a person sees while a command runs, as a real process: a wrong address or a missing
topic said at once, perf's interim lines and failures as they happen, and what Ctrl-C left.

Each test synchronises on the command's own output lines (never on sleeps): a line is
read, then the test acts (stops the broker, sends SIGINT) and reads on.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from aioprod.embedded import EmbeddedBroker
from tests.brokers import refused_port
from tests.cli.conftest import finish, read_until, spawn, topic_names
from tests.readback import read_topic

pytestmark = pytest.mark.integration

INTERIM = re.compile(
    r"aioprod perf: ([\d,]+) records acked, ([\d,]+) failed, .* in total ([\d,]+) sent, ([\d,]+) acked, ([\d,]+) failed"
)


def number(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.mark.parametrize(
    "command",
    [["produce", "t1"], ["perf", "-t", "t1", "-n", "10", "-s", "10"], ["smoke", "-t", "t1"]],
    ids=["produce", "perf", "smoke"],
)
def test_a_wrong_address_is_said_at_once_while_retrying_goes_on(command: list[str]) -> None:
    """Point 1: the first line names the address and the reason, long before max.block.ms (60 s)."""
    address = f"127.0.0.1:{refused_port()}"
    proc = spawn(*command, "-b", address)
    assert proc.stdin is not None
    proc.stdin.write("hi\n")
    proc.stdin.flush()
    first = read_until(proc.stderr, lambda line: True)[-1]
    assert first.startswith("aioprod: warning: ")
    assert address in first and "Connection refused" in first and "retrying" in first
    assert proc.poll() is None  # still waiting for the broker, as configured
    proc.send_signal(signal.SIGINT)
    _, err = finish(proc)
    assert proc.returncode == 130
    assert err.splitlines()[-1] == "aioprod: interrupted: 0 records delivered, 0 failed, 0 unsent"


def test_a_missing_topic_is_said_at_once(bootstrap: str, topic: str) -> None:
    """Point 1: with auto-creation off, the first line says the topic does not exist."""
    proc = spawn("produce", topic, "-b", bootstrap, "-X", "allow.auto.create.topics=false")
    assert proc.stdin is not None
    proc.stdin.write("hi\n")
    proc.stdin.flush()
    first = read_until(proc.stderr, lambda line: True)[-1]
    assert first == (
        f"aioprod: warning: topic {topic!r} does not exist (and allow.auto.create.topics is false); "
        "waiting up to max.block.ms for it"
    )
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    finish(proc)
    assert proc.returncode == 130
    assert topic not in topic_names(bootstrap)


def test_perf_reports_a_stall_as_it_happens_and_times_the_whole_run(topic: str) -> None:
    """Point 2: interim lines while it runs, the failure when it first happens, elapsed = whole run."""
    rate = 1000
    with EmbeddedBroker() as broker:
        proc = spawn(
            *("perf", "-b", broker.bootstrap, "-t", topic, "-n", "2500", "-s", "50", "--json"),
            *("--throughput", str(rate), "--reporting-interval", "200"),
            *("-X", "linger.ms=0", "-X", "request.timeout.ms=500", "-X", "delivery.timeout.ms=1500"),
        )
        read_until(proc.stderr, lambda line: bool((m := INTERIM.match(line)) and number(m[4]) > 0))
        broker.stop()  # the cluster goes away mid-run
        seen = read_until(proc.stderr, lambda line: line.startswith("aioprod: warning: records are failing: "))
        assert seen[-1].startswith("aioprod: warning: records are failing: ")  # said when it happens...
        out, err = finish(proc)
    assert proc.returncode == 1
    interim = [m for line in seen + err.splitlines() if (m := INTERIM.match(line))]
    assert any(number(m[2]) > 0 for m in interim)  # ...and counted in the interim lines
    report = json.loads(out)
    assert report["acked"] > 0 and report["failed"] > 0
    assert report["acked"] + report["failed"] + report["unsent"] == 2500
    # Sends are paced at `rate`, so sending alone took (2500 - 1) / rate seconds: the elapsed
    # time covers the whole run, not just the time up to the last acknowledgement.
    assert report["elapsed_s"] >= (2500 - 1) / rate
    assert report["elapsed_s"] > report["acked"] / rate
    assert err.splitlines()[-1].startswith("aioprod: error: ")


def test_ctrl_c_says_how_many_records_were_delivered(bootstrap: str, topic: str) -> None:
    """Point 6: after three acknowledged lines, Ctrl-C reports them delivered."""
    proc = spawn("produce", topic, "-b", bootstrap, "--report")
    assert proc.stdin is not None
    proc.stdin.write("one\ntwo\nthree\n")
    proc.stdin.flush()
    reports = [json.loads(line) for line in read_until(proc.stdout, lambda line: '"line": 3' in line)]
    assert {r["line"] for r in reports} == {1, 2, 3}
    proc.send_signal(signal.SIGINT)
    _, err = finish(proc)
    assert proc.returncode == 130
    assert err.splitlines()[-1] == "aioprod: interrupted: 3 records delivered, 0 failed, 0 unsent"
    assert sorted(r.value or b"" for r in read_topic(bootstrap, topic)) == [b"one", b"three", b"two"]


def lingering_perf(bootstrap: str, topic: str) -> tuple[subprocess.Popen[str], int]:
    """A perf run whose records all wait in the buffer (10 min linger); once it has queued some,
    (the process, how many it had queued then)."""
    proc = spawn(
        *("perf", "-b", bootstrap, "-t", topic, "-n", "100000", "-s", "10"),
        *("--throughput", "1000", "--reporting-interval", "100"),
        *("-X", "linger.ms=600000", "-X", "delivery.timeout.ms=700000", "-X", "batch.size=1000000"),
    )
    lines = read_until(proc.stderr, lambda line: bool((m := INTERIM.match(line)) and number(m[3]) >= 50))
    match = INTERIM.match(lines[-1])
    assert match is not None and number(match[4]) == 0  # lingering: nothing acknowledged yet
    return proc, number(match[3])


def test_ctrl_c_delivers_what_is_queued_and_says_so(bootstrap: str, topic: str) -> None:
    """Point 6: the first Ctrl-C stops sending and delivers what was queued, as kcat does."""
    proc, queued = lingering_perf(bootstrap, topic)
    proc.send_signal(signal.SIGINT)
    _, err = finish(proc)
    assert proc.returncode == 130
    delivering, last = err.splitlines()[-2:]
    assert re.fullmatch(
        r"aioprod: warning: interrupted: delivering the [\d,]+ records queued \(Ctrl-C again .*\)", delivering
    )
    match = re.fullmatch(r"aioprod: interrupted: ([\d,]+) records delivered, 0 failed, 0 unsent", last)
    assert match is not None, last
    assert number(match[1]) >= queued
    assert len(read_topic(bootstrap, topic)) == number(match[1])


def test_a_second_ctrl_c_abandons_them_as_unsent(topic: str) -> None:
    """Point 6: with the broker gone, a second Ctrl-C leaves at once, counting the records unsent."""
    with EmbeddedBroker() as broker:
        proc, queued = lingering_perf(broker.bootstrap, topic)
        broker.stop()
        proc.send_signal(signal.SIGINT)
        read_until(proc.stderr, lambda line: "interrupted: delivering the" in line)
        proc.send_signal(signal.SIGINT)
        _, err = finish(proc)
    assert proc.returncode == 130
    last = err.splitlines()[-1]
    match = re.fullmatch(r"aioprod: interrupted: 0 records delivered, 0 failed, ([\d,]+) unsent", last)
    assert match is not None, last
    assert number(match[1]) >= queued


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP])
def test_a_terminated_command_stops_its_embedded_broker(stop: signal.Signals) -> None:
    """SIGTERM (a CI job cancelled, ``timeout``, ``docker stop``) left the broker running,
    orphaned; SIGHUP (the terminal closed, an ssh session dropped) killed the command with nothing
    delivered or cleaned up. Now both stop it as Ctrl-C does, here while perf runs flat out."""
    proc = spawn("perf", "-t", "t1", "-n", "100000000", "-s", "10", "--reporting-interval", "200")
    read_until(proc.stderr, lambda line: INTERIM.search(line) is not None)  # running, on the embedded broker
    (broker,) = _children(proc.pid)
    proc.send_signal(stop)
    _, err = finish(proc)
    assert proc.returncode == 130
    assert "aioprod: interrupted" in err
    assert not _alive(broker)


def test_a_command_whose_embedded_broker_dies_says_so_at_once() -> None:
    """It retried the dead broker for delivery_timeout_ms (about two minutes), then perf blamed
    the buffer ("buffer_memory ... stayed full"), never the broker."""
    proc = spawn("perf", "-t", "t1", "-n", "100000000", "-s", "10", "--reporting-interval", "200")
    read_until(proc.stderr, lambda line: INTERIM.search(line) is not None)
    (broker,) = _children(proc.pid)
    os.kill(broker, signal.SIGKILL)
    _, err = finish(proc, timeout=60)  # (it took 122 s)
    assert proc.returncode == 1, err
    last = err.splitlines()[-1]
    assert "the embedded broker on" in last and "exited with code -9" in last and "records delivered" in last, last
    assert "interrupted" not in err, err


def test_a_smoke_test_whose_embedded_broker_dies_says_what_became_of_its_records() -> None:
    """docs/cli.md promises the counts with the broker's last output; smoke gave the output alone."""
    proc = spawn("smoke", "-n", "100000000")
    read_until(proc.stdout, lambda line: "started an embedded Tansu broker" in line)
    (broker,) = _children(proc.pid)
    os.kill(broker, signal.SIGKILL)
    _, err = finish(proc, timeout=60)
    assert proc.returncode == 1, err
    last = err.splitlines()[-1]
    assert "the embedded broker on" in last and "exited with code -9" in last, last
    assert re.search(r"; [\d,]+ records? delivered, [\d,]+ failed, [\d,]+ unsent", last), last


def test_a_command_under_nohup_outlives_a_hangup() -> None:
    """SIGHUP ignored at start (nohup) stays ignored, as the JVM leaves it: the handler that
    stops a command on a hangup stopped `nohup aioprod perf &` at logout."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aioprod.cli",
            "perf",
            "-t",
            "t1",
            "-n",
            "100000000",
            "-s",
            "10",
            "--reporting-interval",
            "200",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),  # what nohup(1) does before exec
    )
    read_until(proc.stderr, lambda line: INTERIM.search(line) is not None)
    proc.send_signal(signal.SIGHUP)
    for _ in range(3):  # still running and reporting (a stopped command prints its summary and ends)
        read_until(proc.stderr, lambda line: INTERIM.search(line) is not None)
    proc.send_signal(signal.SIGINT)
    _, err = finish(proc)
    assert proc.returncode == 130, err
