"""The FAKE cluster's transaction and group coordinator: not Kafka's, only what the
transactional producer's fault tests need.

It keeps one transaction per transactional id (producer id, epoch, partitions, pending
offsets), fences older epochs, writes commit/abort markers into the partitions' logs,
applies committed offsets and answers OffsetFetch for them. Tests script its answers per API (``script``), move it to
another node (it then answers NOT_COORDINATOR where it was), hold an answer back after
acting on it (an EndTxn whose answer is lost), and switch on transactions v2
(``transaction_version = 2``: finalized feature, Produce v12, EndTxn and TxnOffsetCommit
v5, partitions and offsets added implicitly, the epoch bumped by every EndTxn).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aioprod.protocol import messages as m

if TYPE_CHECKING:
    from tests.fakes.cluster import ScriptedCluster

NONE = 0
NOT_COORDINATOR = 16
INVALID_TXN_STATE = 48
PRODUCER_FENCED = 90
UNSTABLE = 88  # UNSTABLE_OFFSET_COMMIT


class Lost:
    """A scripted answer: act on the request, then never answer it (the connection is cut)."""


@dataclass
class FakeTransaction:
    transactional_id: str
    producer_id: int
    epoch: int
    ongoing: bool = False
    partitions: set[tuple[str, int]] = field(default_factory=set)
    #: group -> (topic, partition) -> offset, committed with the transaction.
    offsets: dict[str, dict[tuple[str, int], int]] = field(default_factory=dict)
    #: The last EndTxn result and the epoch it was sent with, for retries of a lost answer.
    last_end: tuple[bool, int] | None = None


@dataclass
class FakeCoordinator:
    cluster: ScriptedCluster
    #: The node that coordinates every transactional id and group.
    node: int = 1
    #: 2: the cluster finalizes ``transaction.version`` 2 (KIP-890 part 2).
    transaction_version: int = 0
    #: Answers per API key, in order: an error code, or :class:`Lost`.
    script: dict[int, deque[int | type[Lost]]] = field(default_factory=dict)
    #: The error message a scripted FindCoordinator refusal carries.
    find_refusal_message: str | None = None
    transactions: dict[str, FakeTransaction] = field(default_factory=dict)
    #: group -> (topic, partition) -> committed offset.
    committed: dict[str, dict[tuple[str, int], int]] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(5000))

    def move_to(self, node: int) -> None:
        self.node = node

    def scripted(self, api_key: int) -> int | type[Lost]:
        answers = self.script.get(api_key)
        return answers.popleft() if answers else NONE

    # -- requests --------------------------------------------------------------------------------

    def find(self, request: m.FindCoordinatorRequest) -> m.FindCoordinatorResponse:
        keys = request.coordinator_keys or [request.key]
        code = self.scripted(m.FindCoordinatorRequest.API_KEY)
        if code is not NONE:  # a scripted refusal, for every key asked
            assert isinstance(code, int)
            said = self.find_refusal_message
            refused = [m.FindCoordinatorResponseCoordinator(k, -1, "", -1, code, said) for k in keys]
            return m.FindCoordinatorResponse(
                error_code=code, error_message=said, node_id=-1, host="", port=-1, coordinators=refused
            )
        node = self.cluster.nodes[self.node]
        found = [m.FindCoordinatorResponseCoordinator(k, node.node_id, node.host, node.port, NONE, None) for k in keys]
        return m.FindCoordinatorResponse(
            error_code=NONE, node_id=node.node_id, host=node.host, port=node.port, coordinators=found
        )

    def init_producer_id(self, txn_id: str, request: m.InitProducerIdRequest) -> m.InitProducerIdResponse:
        txn = self.transactions.get(txn_id)
        if txn is None:
            txn = self.transactions[txn_id] = FakeTransaction(txn_id, next(self._ids), 0)
        else:
            if request.producer_id >= 0 and (request.producer_id, request.producer_epoch) != (
                txn.producer_id,
                txn.epoch,
            ):
                return m.InitProducerIdResponse(error_code=PRODUCER_FENCED, producer_epoch=-1)
            if txn.ongoing:
                self._end(txn, commit=False)  # a new instance fences the old one's transaction
            txn.epoch += 1
            # As Kafka, which checks the epoch first: a retried EndTxn of the fenced epoch is
            # answered PRODUCER_FENCED, whether that EndTxn had ended the transaction or not.
            txn.last_end = None
        return m.InitProducerIdResponse(producer_id=txn.producer_id, producer_epoch=txn.epoch)

    def add_partitions(self, request: m.AddPartitionsToTxnRequest) -> m.AddPartitionsToTxnResponse:
        txn = self.transactions.get(request.v3_and_below_transactional_id)
        code = self._check(txn, request.v3_and_below_producer_id, request.v3_and_below_producer_epoch)
        results = []
        for topic in request.v3_and_below_topics:
            if code == NONE and txn is not None:
                txn.partitions.update((topic.name, p) for p in topic.partitions)
                txn.ongoing = True
            parts = [m.AddPartitionsToTxnResponsePartitionResult(p, code) for p in topic.partitions]
            results.append(m.AddPartitionsToTxnResponseTopicResult(topic.name, parts))
        return m.AddPartitionsToTxnResponse(results_by_topic_v3_and_below=results)

    def add_offsets(self, request: m.AddOffsetsToTxnRequest) -> m.AddOffsetsToTxnResponse:
        txn = self.transactions.get(request.transactional_id)
        code = self._check(txn, request.producer_id, request.producer_epoch)
        if code == NONE and txn is not None:
            txn.offsets.setdefault(request.group_id, {})
            txn.ongoing = True
        return m.AddOffsetsToTxnResponse(error_code=code)

    def commit_offsets(self, request: m.TxnOffsetCommitRequest, version: int) -> m.TxnOffsetCommitResponse:
        txn = self.transactions.get(request.transactional_id)
        code = self._check(txn, request.producer_id, request.producer_epoch)
        implicit = version >= 5 and self.transaction_version >= 2
        if code == NONE and txn is not None:
            if request.group_id not in txn.offsets and not implicit:
                code = INVALID_TXN_STATE  # v1: AddOffsetsToTxn must come first
            else:
                pending = txn.offsets.setdefault(request.group_id, {})
                for topic in request.topics:
                    for p in topic.partitions:
                        pending[(topic.name, p.partition_index)] = p.committed_offset
                txn.ongoing = True
        topics = [
            m.TxnOffsetCommitResponseTopic(
                t.name, [m.TxnOffsetCommitResponsePartition(p.partition_index, code) for p in t.partitions]
            )
            for t in request.topics
        ]
        return m.TxnOffsetCommitResponse(topics=topics)

    def end(self, request: m.EndTxnRequest, version: int) -> m.EndTxnResponse:
        txn = self.transactions.get(request.transactional_id)
        v2 = version >= 5 and self.transaction_version >= 2
        if txn is not None and not txn.ongoing and txn.last_end is not None:
            # A retry of an EndTxn whose answer was lost: the same result is a success.
            committed, epoch = txn.last_end
            if committed == request.committed and request.producer_epoch == epoch:
                return m.EndTxnResponse(error_code=NONE, producer_id=txn.producer_id, producer_epoch=txn.epoch)
        code = self._check(txn, request.producer_id, request.producer_epoch)
        if code == NONE and txn is not None:
            if not txn.ongoing:
                code = INVALID_TXN_STATE
            else:
                txn.last_end = (request.committed, request.producer_epoch)
                self._end(txn, commit=request.committed)
                if v2:
                    txn.epoch += 1  # KIP-890: every transaction ends with a new epoch
        if txn is None:
            return m.EndTxnResponse(error_code=code)
        return m.EndTxnResponse(error_code=code, producer_id=txn.producer_id, producer_epoch=txn.epoch)

    def fetch_offsets(self, request: m.OffsetFetchRequest, version: int) -> m.OffsetFetchResponse:
        """Every committed offset of the group (the fake answers the whole group, whatever was
        asked); with ``require_stable``, UNSTABLE_OFFSET_COMMIT for a partition whose offset an
        open transaction holds, as Kafka does (KIP-447)."""
        group = request.groups[0].group_id if version >= 8 else request.group_id
        pending = {tp for txn in self.transactions.values() if txn.ongoing for tp in txn.offsets.get(group, {})}
        by_topic: dict[str, list[tuple[int, int, int]]] = {}
        for (topic, index), offset in sorted(self.committed.get(group, {}).items()):
            unstable = request.require_stable and (topic, index) in pending
            by_topic.setdefault(topic, []).append((index, -1 if unstable else offset, UNSTABLE if unstable else NONE))
        for topic, index in sorted(pending - set(self.committed.get(group, {}))):
            if request.require_stable:
                by_topic.setdefault(topic, []).append((index, -1, UNSTABLE))
        if version >= 8:
            topics = [
                m.OffsetFetchResponseTopics(t, [m.OffsetFetchResponsePartitions(i, o, -1, None, c) for i, o, c in ps])
                for t, ps in by_topic.items()
            ]
            return m.OffsetFetchResponse(groups=[m.OffsetFetchResponseGroup(group, topics)])
        return m.OffsetFetchResponse(
            topics=[
                m.OffsetFetchResponseTopic(t, [m.OffsetFetchResponsePartition(i, o, -1, None, c) for i, o, c in ps])
                for t, ps in by_topic.items()
            ]
        )

    # -- what the partitions' leaders ask ------------------------------------------------------------

    def admit(self, txn_id: str | None, topic: str, partition: int, producer_id: int, epoch: int, version: int) -> int:
        """May this transactional batch be written? (The leader's check with the coordinator.)"""
        txn = self.transactions.get(txn_id or "")
        code = self._check(txn, producer_id, epoch)
        if code != NONE or txn is None:
            return code
        if (topic, partition) not in txn.partitions:
            if version >= 12 and self.transaction_version >= 2:
                txn.partitions.add((topic, partition))  # KIP-890: the produce request adds it
                txn.ongoing = True
            else:
                return INVALID_TXN_STATE  # "Partition was not added to the transaction"
        return NONE

    # -- internals ----------------------------------------------------------------------------------

    def _check(self, txn: FakeTransaction | None, producer_id: int, epoch: int) -> int:
        if txn is None or producer_id != txn.producer_id:
            return 49  # INVALID_PRODUCER_ID_MAPPING
        if epoch < txn.epoch:
            return PRODUCER_FENCED
        if epoch > txn.epoch:
            return 47  # INVALID_PRODUCER_EPOCH
        return NONE

    def _end(self, txn: FakeTransaction, *, commit: bool) -> None:
        marker = "commit" if commit else "abort"
        for topic, index in sorted(txn.partitions):
            self.cluster.write_marker(topic, index, txn.producer_id, txn.epoch, marker)
        if commit:
            for group, offsets in txn.offsets.items():
                self.committed.setdefault(group, {}).update(offsets)
        txn.partitions.clear()
        txn.offsets.clear()
        txn.ongoing = False
