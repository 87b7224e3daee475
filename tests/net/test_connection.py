"""How a connection hands responses back to a sender that passed ``on_answer``, on the
scripted fake cluster (in-memory network, virtual time)."""

from __future__ import annotations

import asyncio
from typing import Any

from aioprod.errors import KafkaConnectionError
from aioprod.net.connection import BrokerConnection
from aioprod.protocol.messages import MetadataRequest, MetadataResponse
from tests.conftest import Scripted


async def connected(scripted: Scripted) -> BrokerConnection:
    node = scripted.cluster.nodes[1]
    conn = BrokerConnection(1, node.host, node.port, client_id="t", request_timeout=30.0, max_in_flight=5)
    await conn.open(setup_timeout=5.0)
    return conn


async def test_a_response_is_handed_over_by_the_reader_as_it_is_read(scripted: Scripted) -> None:
    # A future's done-callbacks run one loop iteration after the reader resolves it; on every
    # produce round trip that was an iteration of latency. on_answer runs in the reader's step.
    conn = await connected(scripted)
    answered: list[tuple[Any, str]] = []
    done = asyncio.Event()

    def on_answer(answer: Any) -> None:
        task = asyncio.current_task()
        answered.append((answer, "" if task is None else task.get_name()))
        done.set()

    conn.send_nowait(MetadataRequest(topics=[]), on_answer)
    await done.wait()
    ((answer, task_name),) = answered
    assert isinstance(answer, MetadataResponse) and task_name == "aioprod-reader-1"
    conn.close()


async def test_a_closed_connection_answers_with_its_error_later_never_inside_send(scripted: Scripted) -> None:
    # The sender writes requests in a loop over nodes: an answer from inside send_nowait would
    # run its bookkeeping in the middle of that loop.
    conn = await connected(scripted)
    answers: list[Any] = []
    conn.send_nowait(MetadataRequest(topics=[]), answers.append)
    conn.close(KafkaConnectionError("gone"))
    conn.send_nowait(MetadataRequest(topics=[]), answers.append)
    assert answers == []
    await asyncio.sleep(0)
    assert [str(a) for a in answers] == ["gone", "gone"]
    assert all(isinstance(a, KafkaConnectionError) for a in answers)


async def test_an_answer_handler_that_raises_does_not_stop_the_reader(scripted: Scripted) -> None:
    conn = await connected(scripted)

    def broken(answer: Any) -> None:
        raise RuntimeError("bug in a handler")

    conn.send_nowait(MetadataRequest(topics=[]), broken)
    assert isinstance(await conn.send(MetadataRequest(topics=[])), MetadataResponse)
    assert not conn.closed
    conn.close()
