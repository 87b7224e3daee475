"""The commands' topic check against a cluster that never answers, in virtual time.

The check gets a head start before the producer asks about the topic (so its line comes
first); it must not make the command's error later than ``max.block.ms``.
"""

from __future__ import annotations

import asyncio
import io
import re

import pytest

from aioprod.cli.cluster import ask_metadata
from aioprod.cli.common import CliError
from aioprod.cli.produce import LineFormat, produce_lines
from aioprod.cli.smoke import run_smoke
from aioprod.cli.stats import AckTracker
from aioprod.config import ProducerConfig
from aioprod.errors import KafkaTimeoutError
from tests.conftest import Scripted
from tests.fakes.network import ServerSide

MAX_BLOCK_MS = 5_000


class SilentBroker:
    """Accepts connections and never reads from them: a cluster that hangs."""

    def accept(self, conn: ServerSide) -> None:
        conn.reading = False


def silent_cluster(scripted: Scripted) -> dict[str, object]:
    scripted.network.listen("silent.example", 9092, SilentBroker())
    return {"bootstrap_servers": "silent.example:9092", "max_block_ms": MAX_BLOCK_MS}


async def test_produce_fails_when_max_block_ms_runs_out_not_a_head_start_later(scripted: Scripted) -> None:
    options = silent_cluster(scripted)
    start = scripted.clock.now
    with pytest.raises(CliError, match=f"topic 't' not present in metadata after {MAX_BLOCK_MS} ms"):
        await produce_lines(options, "t", io.BytesIO(b"one\n"), b"\n", LineFormat(), None, AckTracker())
    assert scripted.clock.now - start == pytest.approx(MAX_BLOCK_MS / 1000)


async def test_a_wait_that_ends_during_the_first_attempt_says_what_the_attempt_is_at(scripted: Scripted) -> None:
    # Before that attempt's own timeout (request_timeout_ms) the error had no reason to give.
    with pytest.raises(CliError) as info:
        options = silent_cluster(scripted)
        await produce_lines(options, "t", io.BytesIO(b"one\n"), b"\n", LineFormat(), None, AckTracker())
    # (The producer's attempt began after the check's head start.)
    assert re.search(
        rf"topic 't' not present in metadata after {MAX_BLOCK_MS} ms "
        r"\(no broker answered yet: silent\.example:9092, \d+ ms in its ApiVersions handshake\)$",
        str(info.value),
    )


async def test_produce_says_why_the_topic_was_not_found_as_the_producer_would(scripted: Scripted) -> None:
    # The check's own timeout said only "not present in metadata", dropping the producer's reason.
    # The check outlasts its head start; the producer's handshake times out before max_block_ms.
    options = {**silent_cluster(scripted), "request_timeout_ms": 3000, "max_block_ms": 8000}
    with pytest.raises(CliError, match=r"after 8000 ms \(no broker reachable: ApiVersions handshake with"):
        await produce_lines(options, "t", io.BytesIO(b"one\n"), b"\n", LineFormat(), None, AckTracker())


async def test_smoke_fails_when_max_block_ms_runs_out_not_a_head_start_later(scripted: Scripted) -> None:
    options = silent_cluster(scripted)
    start = scripted.clock.now
    with pytest.raises(CliError, match=f"smoke test failed on silent.example:9092: .*after {MAX_BLOCK_MS} ms"):
        await run_smoke(options, "t", 10, AckTracker(), embedded=False, batch_size_given=False)
    assert scripted.clock.now - start == pytest.approx(MAX_BLOCK_MS / 1000)


async def test_metadata_waits_for_a_broker_still_starting_and_says_so_once(scripted: Scripted) -> None:
    # One pass over the bootstrap servers: a broker not listening yet failed the command in
    # 0.4 s, though it promises to wait max.block.ms as the Kafka tools do.
    cluster = scripted.cluster
    cluster.create_topic("t", 2)
    cluster.stop(1)
    said: list[str] = []
    config = ProducerConfig.from_options(bootstrap_servers=cluster.bootstrap, max_block_ms=MAX_BLOCK_MS)
    asking = asyncio.ensure_future(ask_metadata(config, ["t"], retrying=lambda exc: said.append(str(exc))))
    await scripted.clock.advance(2)
    assert not asking.done()
    cluster.start(1)
    response = await asking
    assert [t.name for t in response.topics] == ["t"]
    assert len(said) == 1 and "Connect call failed" in said[0]


async def test_metadata_from_a_cluster_that_never_answers_ends_at_max_block_ms_saying_why(scripted: Scripted) -> None:
    cluster = scripted.cluster
    cluster.stop(1)
    config = ProducerConfig.from_options(bootstrap_servers=cluster.bootstrap, max_block_ms=MAX_BLOCK_MS)
    start = scripted.clock.now
    with pytest.raises(KafkaTimeoutError, match=f"within {MAX_BLOCK_MS} ms: connecting to broker -1 at .* failed"):
        await ask_metadata(config, None)
    assert scripted.clock.now - start == pytest.approx(MAX_BLOCK_MS / 1000)


@pytest.mark.parametrize("max_block_ms", [1000, 2000])
async def test_a_max_block_ms_within_the_head_start_still_says_why(scripted: Scripted, max_block_ms: int) -> None:
    # The head start took all of max.block.ms: the producer never tried the cluster, and the
    # error said "not present in metadata" with no reason (docs/cli.md's example shows one).
    cluster = scripted.cluster
    cluster.stop(1)
    options = {"bootstrap_servers": cluster.bootstrap, "max_block_ms": max_block_ms}
    start = scripted.clock.now
    with pytest.raises(CliError, match=rf"after {max_block_ms} ms \(no broker reachable: connecting to broker -1"):
        await run_smoke(options, "t", 10, AckTracker(), embedded=False, batch_size_given=False)
    assert scripted.clock.now - start == pytest.approx(max_block_ms / 1000)
