"""A FAKE Kafka cluster for injecting precise faults: not a Kafka implementation.

It speaks just enough ApiVersions, Metadata, Produce, InitProducerId and ListOffsets for
the producer, over :mod:`tests.fakes.network`, with the behaviour a fault needs under
the test's control: which node leads a partition and at what epoch, what a lagging node
reports, answers scripted per partition, responses held back or delayed, throttling, a
node that stops reading or goes down, and Kafka's idempotence checks (duplicates answered
with the original offset, or DUPLICATE_SEQUENCE_NUMBER as Tansu does; sequence gaps;
unknown producers; fenced epochs). Like a real broker it handles one request at a time
per connection, in order, so a held produce holds everything behind it on that
connection. Everything accepted is kept per partition in ``log``, across leaders, so
tests check order, duplicates and sequences; requests are recorded in ``requests``.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from aioprod.protocol import messages as m
from aioprod.protocol.framing import FrameDecoder, decode_request_body, decode_request_header, encode_response
from aioprod.protocol.records import read_batch
from tests.fakes.coordinator import FakeCoordinator, Lost
from tests.fakes.network import Listener, ServerSide

NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
TOPIC_AUTHORIZATION_FAILED = 29
NOT_LEADER_OR_FOLLOWER = 6
MESSAGE_TOO_LARGE = 10
DUPLICATE_SEQUENCE_NUMBER = 46
INVALID_PRODUCER_EPOCH = 47
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
UNKNOWN_PRODUCER_ID = 59
PRODUCER_FENCED = 90
NOT_COORDINATOR = 16

REQUESTS: dict[int, type] = {
    cls.API_KEY: cls
    for cls in (
        m.ApiVersionsRequest,
        m.MetadataRequest,
        m.ProduceRequest,
        m.InitProducerIdRequest,
        m.ListOffsetsRequest,
        m.FindCoordinatorRequest,
        m.AddPartitionsToTxnRequest,
        m.AddOffsetsToTxnRequest,
        m.TxnOffsetCommitRequest,
        m.EndTxnRequest,
        m.OffsetFetchRequest,
    )
}


def default_versions() -> dict[int, tuple[int, int]]:
    return {
        m.ApiVersionsRequest.API_KEY: (0, 4),
        m.MetadataRequest.API_KEY: (1, 12),
        m.ProduceRequest.API_KEY: (3, 11),
        m.InitProducerIdRequest.API_KEY: (0, 5),
        m.ListOffsetsRequest.API_KEY: (1, 8),
        m.FindCoordinatorRequest.API_KEY: (0, 6),
        m.AddPartitionsToTxnRequest.API_KEY: (0, 5),
        m.AddOffsetsToTxnRequest.API_KEY: (0, 4),
        m.TxnOffsetCommitRequest.API_KEY: (0, 4),
        m.EndTxnRequest.API_KEY: (0, 4),
        m.OffsetFetchRequest.API_KEY: (0, 9),
    }


@dataclass(frozen=True)
class Appended:
    """One batch a leader accepted, or a transaction marker the coordinator wrote."""

    node: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    values: tuple[bytes | None, ...]
    base_offset: int
    transactional: bool = False
    #: "commit" or "abort" for a transaction marker (a control batch), else None.
    marker: str | None = None


@dataclass
class _ProducerState:
    epoch: int
    #: The last five batches: (first sequence, last sequence, base offset).
    recent: deque[tuple[int, int, int]] = field(default_factory=lambda: deque(maxlen=5))


@dataclass
class Partition:
    leader: int
    topic_id: uuid.UUID = field(default_factory=uuid.uuid4)
    epoch: int = 0
    log: list[Appended] = field(default_factory=list)
    #: Reject batches larger than this with MESSAGE_TOO_LARGE (None: no limit).
    max_batch_bytes: int | None = None
    producers: dict[int, _ProducerState] = field(default_factory=dict)

    @property
    def values(self) -> list[bytes | None]:
        """Every record written, as a read_uncommitted consumer sees them."""
        return [v for batch in self.log for v in batch.values]

    @property
    def committed(self) -> list[bytes | None]:
        """What a read_committed consumer sees: transactional records once their commit
        marker is there, never those of an aborted transaction."""
        seen: list[bytes | None] = []
        pending: dict[int, list[bytes | None]] = {}
        for batch in self.log:
            if batch.marker is not None:
                values = pending.pop(batch.producer_id, [])
                if batch.marker == "commit":
                    seen.extend(values)
            elif batch.transactional:
                pending.setdefault(batch.producer_id, []).extend(batch.values)
            else:
                seen.extend(batch.values)
        return seen

    @property
    def end_offset(self) -> int:
        return sum(max(1, len(batch.values)) for batch in self.log)


@dataclass(frozen=True)
class Request:
    node: int
    api_key: int
    version: int
    at: float
    body: object


class Hold:
    """A scripted answer: write the batch, then hold the response until released."""


@dataclass
class FakeNode:
    cluster: ScriptedCluster
    node_id: int
    host: str
    port: int
    #: Answers for produce partitions, in arrival order: an error code (the batch is not
    #: written), ``0`` (normal handling) or :class:`Hold`.
    script: deque[int | type[Hold]] = field(default_factory=deque)
    #: Hold every produce response (the batches are written) until :meth:`release`.
    holding: bool = False
    #: Leave produce requests unprocessed (nothing written) until :meth:`release`: a
    #: broker too slow to look at them yet.
    stalling: bool = False
    #: Delay every produce response by this many seconds.
    delay: float = 0.0
    #: Put this throttle_time_ms in every produce response.
    throttle_ms: int = 0
    #: Answer acks=0 produce requests too, as Tansu does (Kafka answers none).
    answers_acks_0: bool = False
    #: What this node says in Metadata, where it differs from the truth: (topic, partition)
    #: -> (leader, leader epoch). A lagging broker.
    stale: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    #: Topic -> how many of its partitions this node names in Metadata, where it differs from
    #: the truth: a broker that lags behind a partition increase.
    stale_counts: dict[str, int] = field(default_factory=dict)
    #: Topics this node's Metadata answers refuse (TOPIC_AUTHORIZATION_FAILED): a broker that
    #: lags behind an ACL grant.
    stale_denied: set[str] = field(default_factory=set)
    connections: list[_Connection] = field(default_factory=list)
    _released: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def accept(self, side: ServerSide) -> None:
        self.connections.append(_Connection(self, side))

    def release(self) -> None:
        """Answer every held produce request, and process every stalled one."""
        self.holding = self.stalling = False
        self._released.set()
        self._released = asyncio.Event()

    def stop_reading(self) -> None:
        for conn in self.connections:
            conn.side.reading = False

    @property
    def open_connections(self) -> int:
        return sum(not conn.side.closed for conn in self.connections)


class _Connection:
    """One client connection: frames handled one at a time, answers in order."""

    def __init__(self, node: FakeNode, side: ServerSide) -> None:
        self.node = node
        self.side = side
        self._decoder = FrameDecoder()
        self._frames: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._closed = asyncio.Event()
        side.on_data = self._received
        side.on_close = self._on_close
        self._task = asyncio.ensure_future(self._serve())

    def _on_close(self) -> None:
        self._closed.set()
        self._frames.put_nowait(None)

    def _received(self, data: bytes) -> None:
        for frame in self._decoder.feed(data):
            self._frames.put_nowait(frame)

    async def _serve(self) -> None:
        while (frame := await self._frames.get()) is not None:
            answer = await self.node.cluster.handle(self, frame)
            if answer is not None:
                self.side.send(answer)

    async def closed_or(self, event: asyncio.Event) -> None:
        """Wait for ``event`` or for this connection to close, whichever comes first."""
        waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(self._closed.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()


class ScriptedCluster:
    """Nodes 1..n at ``127.0.0.1:9091..``; topics are created with :meth:`create_topic`."""

    def __init__(self, network: Listener, nodes: int = 1, ports: Callable[[int], int] | None = None) -> None:
        self.network = network
        #: The port node N listens on (9090 + N unless given: the in-memory network has every port).
        self._port_of = ports or (lambda node_id: 9090 + node_id)
        self.nodes: dict[int, FakeNode] = {}
        self.topics: dict[str, list[Partition]] = {}
        self.versions = default_versions()
        self.requests: list[Request] = []
        #: Error codes InitProducerId answers with, in order, before it succeeds.
        self.init_script: deque[int] = deque()
        #: Answer a repeated batch as Tansu does (DUPLICATE_SEQUENCE_NUMBER) instead of
        #: as Apache Kafka does (success with the original offset).
        self.duplicate_error = False
        #: Kafka 2.5+: a producer the partition holds no state for is taken at any sequence
        #: (it answered UNKNOWN_PRODUCER_ID before, as this fake does by default).
        self.accepts_unknown_producers = False
        #: As Tansu: a producer's epoch above the one InitProducerId handed out (a client's own
        #: bump, Java's bumpIdempotentProducerEpoch) is refused as PRODUCER_FENCED.
        self.refuses_client_epoch_bumps = False
        #: Put CurrentLeader/NodeEndpoints in NOT_LEADER answers (KIP-951, Produce v10+).
        self.kip951 = True
        self._producer_ids = itertools.count(1000)
        #: The transaction and group coordinator (node 1 unless moved).
        self.coordinator = FakeCoordinator(self)
        self.clock: Callable[[], float] = lambda: asyncio.get_running_loop().time()
        for node_id in range(1, nodes + 1):
            self.add_node(node_id)

    # -- set-up and faults -------------------------------------------------------------------

    def add_node(self, node_id: int) -> FakeNode:
        node = FakeNode(self, node_id, "127.0.0.1", self._port_of(node_id))
        self.nodes[node_id] = node
        self.network.listen(node.host, node.port, node)
        return node

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{n.host}:{n.port}" for n in self.nodes.values())

    def create_topic(self, name: str, leaders: list[int] | int = 1) -> list[Partition]:
        """``leaders``: one leader per partition, or a partition count (all led by node 1)."""
        leader_list = [1] * leaders if isinstance(leaders, int) else leaders
        topic_id = uuid.uuid4()  # a topic created again gets a new id, as in Kafka
        self.topics[name] = [Partition(leader, topic_id) for leader in leader_list]
        return self.topics[name]

    def partition(self, topic: str, index: int = 0) -> Partition:
        return self.topics[topic][index]

    def move_leader(self, topic: str, index: int, leader: int) -> None:
        part = self.topics[topic][index]
        part.leader = leader
        part.epoch += 1

    def stop(self, node_id: int) -> None:
        """The broker process dies: new connections are refused, open ones are cut."""
        node = self.nodes[node_id]
        self.network.stop_listening(node.host, node.port)
        self.disconnect(node_id)

    def disconnect(self, node_id: int) -> None:
        """The broker closes its client connections (e.g. connections.max.idle.ms) and stays up."""
        for conn in self.nodes[node_id].connections:
            conn.side.close()

    def start(self, node_id: int) -> None:
        node = self.nodes[node_id]
        self.network.listen(node.host, node.port, node)

    def requests_of(self, request_cls: type, node: int | None = None) -> list[Request]:
        return [r for r in self.requests if r.api_key == request_cls.API_KEY and (node is None or r.node == node)]

    # -- request handling ---------------------------------------------------------------------

    async def handle(self, conn: _Connection, frame: bytes) -> bytes | None:
        header, reader = decode_request_header(frame)
        request = decode_request_body(reader, header, REQUESTS[header.api_key])
        node = conn.node
        self.requests.append(Request(node.node_id, header.api_key, header.api_version, self.clock(), request))
        version, cid = header.api_version, header.correlation_id
        if isinstance(request, m.ApiVersionsRequest):
            return encode_response(self._api_versions(), version, cid)
        if isinstance(request, m.MetadataRequest):
            return encode_response(self._metadata(node, request), version, cid)
        if isinstance(request, m.InitProducerIdRequest) and request.transactional_id is None:
            return encode_response(self._init_producer_id(request), version, cid)
        if isinstance(request, m.ListOffsetsRequest):
            return encode_response(self._list_offsets(request), version, cid)
        if isinstance(request, m.FindCoordinatorRequest):
            return encode_response(self.coordinator.find(request), version, cid)
        if not isinstance(request, m.ProduceRequest):
            return self._coordinate(conn, request, version, cid)
        assert isinstance(request, m.ProduceRequest)
        if node.stalling:
            await conn.closed_or(node._released)
            if conn.side.closed:
                return None  # the connection went before the broker looked at the request
        response, hold = self._produce(node, request, version)
        if hold or node.holding:
            await conn.closed_or(node._released)
        if node.delay:
            await asyncio.sleep(node.delay)
        if (request.acks == 0 and not node.answers_acks_0) or conn.side.closed:
            return None
        return encode_response(response, version, cid)

    def _api_versions(self) -> m.ApiVersionsResponse:
        supported = dict(self.versions)
        features = []
        if self.coordinator.transaction_version >= 2:
            supported[m.ProduceRequest.API_KEY] = (3, 12)
            supported[m.EndTxnRequest.API_KEY] = (0, 5)
            supported[m.TxnOffsetCommitRequest.API_KEY] = (0, 5)
            features = [m.ApiVersionsResponseFinalizedFeature("transaction.version", 2, 2)]
        keys = [m.ApiVersionsResponseApiKey(k, lo, hi) for k, (lo, hi) in supported.items()]
        return m.ApiVersionsResponse(api_keys=keys, finalized_features=features, finalized_features_epoch=1)

    def _coordinate(self, conn: _Connection, request: object, version: int, cid: int) -> bytes | None:
        coordinator = self.coordinator
        code = NOT_COORDINATOR if conn.node.node_id != coordinator.node else coordinator.scripted(request.API_KEY)  # type: ignore[attr-defined]
        lost = code is Lost
        if lost or code == 0:
            if isinstance(request, m.InitProducerIdRequest):
                assert request.transactional_id is not None
                response: object = coordinator.init_producer_id(request.transactional_id, request)
            elif isinstance(request, m.AddPartitionsToTxnRequest):
                response = coordinator.add_partitions(request)
            elif isinstance(request, m.AddOffsetsToTxnRequest):
                response = coordinator.add_offsets(request)
            elif isinstance(request, m.TxnOffsetCommitRequest):
                response = coordinator.commit_offsets(request, version)
            elif isinstance(request, m.OffsetFetchRequest):
                response = coordinator.fetch_offsets(request, version)
            else:
                assert isinstance(request, m.EndTxnRequest)
                response = coordinator.end(request, version)
        else:
            assert isinstance(code, int)
            response = _coordinator_error(request, code)
        if lost:
            conn.side.close()  # acted on, but the answer never arrives
            return None
        return encode_response(response, version, cid)  # type: ignore[arg-type]

    def write_marker(self, topic: str, index: int, producer_id: int, epoch: int, marker: str) -> None:
        part = self.topics[topic][index]
        part.log.append(Appended(-1, producer_id, epoch, -1, (), part.end_offset, transactional=True, marker=marker))

    def metadata_view(
        self, node: FakeNode
    ) -> tuple[Sequence[tuple[int, str, int]], Mapping[str, tuple[uuid.UUID, Sequence[tuple[int, int]]]]]:
        """What ``node`` answers metadata from: the brokers (node id, host, port), and each topic's
        id and its partitions' (leader, leader epoch), as ``node`` believes them (its ``stale``)."""
        brokers = [(n.node_id, n.host, n.port) for n in self.nodes.values()]
        topics = {
            name: (
                parts[0].topic_id,
                [
                    node.stale.get((name, index), (part.leader, part.epoch))
                    for index, part in enumerate(parts[: node.stale_counts.get(name, len(parts))])
                ],
            )
            for name, parts in self.topics.items()
        }
        return brokers, topics

    def _metadata(self, node: FakeNode, request: m.MetadataRequest) -> m.MetadataResponse:
        brokers, known = self.metadata_view(node)
        names = list(known) if request.topics is None else [t.name for t in request.topics]
        topics = []
        for name in names:
            topic = known.get(name)
            if name in node.stale_denied:
                topics.append(m.MetadataResponseTopic(TOPIC_AUTHORIZATION_FAILED, name, partitions=[]))
                continue
            if topic is None:
                topics.append(m.MetadataResponseTopic(UNKNOWN_TOPIC_OR_PARTITION, name, partitions=[]))
                continue
            topic_id, parts = topic
            described = []
            for index, (leader, epoch) in enumerate(parts):
                code = 5 if leader < 0 else NONE  # LEADER_NOT_AVAILABLE
                described.append(m.MetadataResponsePartition(code, index, leader, epoch, [leader], [leader], []))
            topics.append(m.MetadataResponseTopic(NONE, name, topic_id=topic_id, partitions=described))
        described_brokers = [m.MetadataResponseBroker(n, host, port) for n, host, port in brokers]
        return m.MetadataResponse(brokers=described_brokers, cluster_id="scripted", controller_id=1, topics=topics)

    def _init_producer_id(self, request: m.InitProducerIdRequest) -> m.InitProducerIdResponse:
        if self.init_script:
            return m.InitProducerIdResponse(error_code=self.init_script.popleft(), producer_epoch=-1)
        return m.InitProducerIdResponse(producer_id=next(self._producer_ids), producer_epoch=0)

    def _list_offsets(self, request: m.ListOffsetsRequest) -> m.ListOffsetsResponse:
        topics = []
        for t in request.topics:
            parts = self.topics[t.name]
            answers = [
                m.ListOffsetsResponsePartition(p.partition_index, NONE, offset=parts[p.partition_index].end_offset)
                for p in t.partitions
            ]
            topics.append(m.ListOffsetsResponseTopic(t.name, answers))
        return m.ListOffsetsResponse(topics=topics)

    def _produce(self, node: FakeNode, request: m.ProduceRequest, version: int) -> tuple[m.ProduceResponse, bool]:
        hold = False
        endpoints: dict[int, m.ProduceResponseNodeEndpoint] = {}
        topics = []
        for t in request.topic_data:
            answers = []
            for p in t.partition_data:
                assert p.records is not None
                scripted = node.script.popleft() if node.script else NONE
                if scripted is Hold:
                    hold = True
                    scripted = NONE
                assert isinstance(scripted, int)
                code, offset = scripted, -1
                if code == NONE:
                    code, offset = self._append(node, t.name, p.index, p.records, request.transactional_id, version)
                answer = m.ProduceResponsePartition(index=p.index, error_code=code, base_offset=offset)
                parts = self.topics.get(t.name)
                part = parts[p.index] if parts is not None and p.index < len(parts) else None
                if code == NOT_LEADER_OR_FOLLOWER and self.kip951 and version >= 10 and part is not None:
                    leader = self.nodes[part.leader]
                    answer.current_leader = m.ProduceResponseLeaderIdAndEpoch(part.leader, part.epoch)
                    endpoints[leader.node_id] = m.ProduceResponseNodeEndpoint(leader.node_id, leader.host, leader.port)
                answers.append(answer)
            topics.append(m.ProduceResponseTopic(name=t.name, partition_responses=answers))
        response = m.ProduceResponse(
            responses=topics, throttle_time_ms=node.throttle_ms, node_endpoints=list(endpoints.values())
        )
        return response, hold

    def _append(
        self, node: FakeNode, topic: str, index: int, records: bytes, txn_id: str | None, version: int
    ) -> tuple[int, int]:
        parts = self.topics.get(topic)
        if parts is None or index >= len(parts):
            return UNKNOWN_TOPIC_OR_PARTITION, -1
        part = parts[index]
        if part.leader != node.node_id:
            return NOT_LEADER_OR_FOLLOWER, -1
        if part.max_batch_bytes is not None and len(records) > part.max_batch_bytes:
            return MESSAGE_TOO_LARGE, -1
        batch = read_batch(records)
        pid, epoch, first = batch.producer_id, batch.producer_epoch, batch.base_sequence
        if batch.is_transactional:
            code = self.coordinator.admit(txn_id, topic, index, pid, epoch, version)
            if code != NONE:
                return code, -1
        if pid >= 0:
            last = first + batch.record_count - 1
            state = part.producers.get(pid)
            if state is None:
                if first != 0 and not self.accepts_unknown_producers:
                    return UNKNOWN_PRODUCER_ID, -1
                state = part.producers[pid] = _ProducerState(epoch)
            elif epoch < state.epoch:
                return INVALID_PRODUCER_EPOCH, -1
            elif epoch > state.epoch:
                if self.refuses_client_epoch_bumps:
                    return PRODUCER_FENCED, -1
                if first != 0:
                    return OUT_OF_ORDER_SEQUENCE_NUMBER, -1
                state.epoch = epoch
                state.recent.clear()
            else:
                for seen_first, seen_last, seen_offset in state.recent:
                    if (seen_first, seen_last) == (first, last):
                        return (DUPLICATE_SEQUENCE_NUMBER, -1) if self.duplicate_error else (NONE, seen_offset)
                expected = (state.recent[-1][1] + 1) % 2**31 if state.recent else 0
                if first != expected:
                    return OUT_OF_ORDER_SEQUENCE_NUMBER, -1
        offset = part.end_offset
        values = tuple(r.value for r in batch.records)
        part.log.append(Appended(node.node_id, pid, epoch, first, values, offset, transactional=batch.is_transactional))
        if pid >= 0:
            part.producers[pid].recent.append((first, first + batch.record_count - 1, offset))
        return NONE, offset


def _coordinator_error(request: object, code: int) -> object:
    """``request``'s response type, answering ``code`` everywhere it can."""
    if isinstance(request, m.InitProducerIdRequest):
        return m.InitProducerIdResponse(error_code=code, producer_epoch=-1)
    if isinstance(request, m.AddPartitionsToTxnRequest):
        results = [
            m.AddPartitionsToTxnResponseTopicResult(
                t.name, [m.AddPartitionsToTxnResponsePartitionResult(p, code) for p in t.partitions]
            )
            for t in request.v3_and_below_topics
        ]
        return m.AddPartitionsToTxnResponse(results_by_topic_v3_and_below=results)
    if isinstance(request, m.AddOffsetsToTxnRequest):
        return m.AddOffsetsToTxnResponse(error_code=code)
    if isinstance(request, m.TxnOffsetCommitRequest):
        topics = [
            m.TxnOffsetCommitResponseTopic(
                t.name, [m.TxnOffsetCommitResponsePartition(p.partition_index, code) for p in t.partitions]
            )
            for t in request.topics
        ]
        return m.TxnOffsetCommitResponse(topics=topics)
    if isinstance(request, m.OffsetFetchRequest):
        return m.OffsetFetchResponse(
            error_code=code, groups=[m.OffsetFetchResponseGroup(g.group_id, error_code=code) for g in request.groups]
        )
    assert isinstance(request, m.EndTxnRequest)
    return m.EndTxnResponse(error_code=code)
