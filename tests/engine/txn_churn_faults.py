"""Seeded randomized harness for the TRANSACTIONAL producer under cluster topology churn.

txn_faults.py's workload, run and checks (transactions sent, committed, aborted, retried or
cancelled; a read_committed reader sees exactly the committed transactions' records, nothing of
an aborted one, all or nothing of one whose outcome the caller never learnt; the group's offsets
those of the committed transactions) under churn_faults.py's topology faults (leaders moving
with or without KIP-951 hints, brokers failing, shutting down, coming back elsewhere, swapping
addresses, joining; partitions added; topics deleted and created again; lagging metadata), and
the transaction coordinator moving: on its own, or with its broker when that one fails over
(the old one then answers NOT_COORDINATOR, the new one COORDINATOR_LOAD_IN_PROGRESS while it
loads the transaction log; FindCoordinator answers COORDINATOR_NOT_AVAILABLE while it is down).

The fake stays an honest Kafka: the coordinator writes its markers into every partition the
transaction touched, whichever broker leads it now, and skips a partition deleted meanwhile
(its records went with it: no reader sees them, whatever the outcome).

    PYTHONPATH=. .venv/bin/python tests/engine/txn_churn_faults.py 0 300      (seeds [0, 300))
    PYTHONPATH=. .venv/bin/python tests/engine/txn_churn_faults.py 17 18 -v   (one seed, with its trace)
    ... -x: txn_faults.py's extras (background sends across commits, buffer pressure, close() with a timeout)
"""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass, field

from aioprod.protocol import messages as m
from tests.engine import churn_faults, txn_faults
from tests.engine.churn_faults import ChurnCluster
from tests.fakes.coordinator import FakeCoordinator

COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15
UNKNOWN_TOPIC_OR_PARTITION = 3
OPERATION_NOT_ATTEMPTED = 55


@dataclass
class MovingCoordinator(FakeCoordinator):
    """The coordinator of a churning cluster: a new one answers COORDINATOR_LOAD_IN_PROGRESS
    until it has loaded the transaction log, and none is found while its broker is down."""

    loading_until: float = 0.0
    #: The brokers down now (the run's).
    down: set[int] = field(default_factory=set)

    #: transactional id -> (when its transaction began, its transaction_timeout_ms).
    began: dict[str, tuple[float, int]] = field(default_factory=dict)

    def expire(self) -> None:
        """Kafka's coordinator aborts a transaction open past its timeout, bumping the epoch
        (the producer's next request with the old one is fenced)."""
        now = self.cluster.clock()
        for txn_id, txn in self.transactions.items():
            start, timeout_ms = self.began.get(txn_id, (now, 0))
            if not txn.ongoing:
                self.began[txn_id] = (now, timeout_ms)
            elif timeout_ms and now - start > timeout_ms / 1000:
                txn.epoch += 1
                self._end(txn, commit=False)
                txn.last_end = None
                self.began[txn_id] = (now, timeout_ms)

    def init_producer_id(self, txn_id: str, request: m.InitProducerIdRequest) -> m.InitProducerIdResponse:
        self.expire()
        self.began[txn_id] = (self.cluster.clock(), request.transaction_timeout_ms)
        return super().init_producer_id(txn_id, request)

    def admit(self, txn_id, topic, partition, producer_id, epoch, version) -> int:
        self.expire()
        return super().admit(txn_id, topic, partition, producer_id, epoch, version)

    def move(self, node: int, load: float) -> None:
        self.move_to(node)
        self.loading_until = self.cluster.clock() + load

    def scripted(self, api_key: int):
        self.expire()
        if api_key != m.FindCoordinatorRequest.API_KEY and self.cluster.clock() < self.loading_until:
            return COORDINATOR_LOAD_IN_PROGRESS
        return super().scripted(api_key)

    def add_partitions(self, request: m.AddPartitionsToTxnRequest) -> m.AddPartitionsToTxnResponse:
        """Kafka's answer when a partition asked for does not exist (any more): that one
        UNKNOWN_TOPIC_OR_PARTITION, the others OPERATION_NOT_ATTEMPTED, none added."""
        topics = self.cluster.topics
        missing = {
            (t.name, p)
            for t in request.v3_and_below_topics
            for p in t.partitions
            if t.name not in topics or p >= len(topics[t.name])
        }
        if not missing:
            return super().add_partitions(request)
        results = [
            m.AddPartitionsToTxnResponseTopicResult(
                t.name,
                [
                    m.AddPartitionsToTxnResponsePartitionResult(
                        p, UNKNOWN_TOPIC_OR_PARTITION if (t.name, p) in missing else OPERATION_NOT_ATTEMPTED
                    )
                    for p in t.partitions
                ],
            )
            for t in request.v3_and_below_topics
        ]
        return m.AddPartitionsToTxnResponse(results_by_topic_v3_and_below=results)

    def find(self, request: m.FindCoordinatorRequest) -> m.FindCoordinatorResponse:
        if self.node in self.down:
            self.script.setdefault(m.FindCoordinatorRequest.API_KEY, deque()).appendleft(COORDINATOR_NOT_AVAILABLE)
        return super().find(request)


class TxnChurnCluster(ChurnCluster):
    def __init__(self, network, nodes: int) -> None:
        super().__init__(network, nodes=nodes)
        self.coordinator = MovingCoordinator(self)

    def write_marker(self, topic: str, index: int, producer_id: int, epoch: int, marker: str) -> None:
        parts = self.topics.get(topic)
        if parts is not None and index < len(parts):  # a deleted partition gets no marker
            super().write_marker(topic, index, producer_id, epoch, marker)


class Run(txn_faults.Run):
    TOPICS = churn_faults.TOPICS
    Cluster = TxnChurnCluster
    REFUSALS = churn_faults.Run.REFUSALS
    FAULTS = [*churn_faults.Run.FAULTS, "move_coord", "move_coord", "coord_err"]
    cluster: TxnChurnCluster

    # churn_faults.py's topology faults, as they are there
    fault = churn_faults.Run.fault
    fault_targets = churn_faults.Run.fault_targets
    live = churn_faults.Run.live
    members = churn_faults.Run.members
    _listen = churn_faults.Run._listen
    _unlisten = churn_faults.Run._unlisten
    _stop = churn_faults.Run._stop
    _start = churn_faults.Run._start
    elect_away = churn_faults.Run.elect_away
    pick_partition = churn_faults.Run.pick_partition
    _back = churn_faults.Run._back
    _recreate = churn_faults.Run._recreate
    _catch_up = churn_faults.Run._catch_up
    count = churn_faults.Run.count
    incarnations = churn_faults.Run.incarnations

    def __init__(self, seed: int, verbose: bool) -> None:
        super().__init__(seed, verbose)
        self.listening: dict[int, set[tuple[str, int]]] = {}
        self.moves = 0
        self.chaos_mean = self.rng.choice(churn_faults.Run.CHAOS_MEANS)

    def cluster_built(self) -> None:
        churn_faults.Run.cluster_built(self)
        c = self.cluster
        self.bootstrap = [node.address for node in c.nodes.values()]
        c.coordinator.down = self.stopped
        c.kip951 = self.rng.random() < churn_faults.Run.KIP951
        c.accepts_unknown_producers = self.rng.random() < 0.5
        self.log(f"kip951={c.kip951} accepts_unknown_producers={c.accepts_unknown_producers}")

    def inflict(self, kind: str, n: int) -> None:
        coordinator = self.cluster.coordinator
        if kind == "coord_err":  # the coordinator's own refusals, as txn_faults.py draws them
            api = self.rng.choice(txn_faults.COORD_APIS[:-1])
            code = self.rng.choice(txn_faults.COORD_ERRORS)
            coordinator.script.setdefault(api, deque()).append(code)
            self.log(f"FAULT coordinator api {api} next answers {getattr(code, '__name__', code)}")
            return
        if kind != "move_coord":
            churn_faults.Run.inflict(self, kind, n)
            if coordinator.node not in self.stopped:
                return
            if kind == "restart":  # no election: found again once its broker is back
                return
        live = [n for n in self.live() if n != coordinator.node] or self.live()
        if not live:
            return
        to = self.rng.choice(live)
        load = self.rng.choice([0.0, 0.05, 0.5, 3.0])
        self.log(f"FAULT coordinator {coordinator.node} -> node {to}, loading for {load}s")
        coordinator.move(to, load)

    def calls(self) -> int:
        """Enough for a batch to a partition deleted meanwhile to expire (delivery_timeout_ms),
        twice over: a call the caller cancels takes less than max_block_ms."""
        opts = self.opts
        return max(30, 10 + 2 * (opts["delivery_timeout_ms"] + opts["request_timeout_ms"]) // opts["max_block_ms"])

    def refused(self, topic: str, part: int | None, exc: Exception) -> None:
        self.log(f"  refused {type(exc).__name__}: {exc}")

    def heal(self) -> None:
        """churn_faults.py's, and the bootstrap addresses reach the cluster again (a stable name
        in front of the brokers): brokers that all moved off every address the producer knew
        (the bootstrap ones too) leave any client cut off for good, waiting in commit or abort."""
        churn_faults.Run.heal(self)
        c = self.cluster
        c.coordinator.script.clear()
        for address in self.bootstrap:
            if address not in c.network.servers:
                c.network.listen(*address, c.nodes[self.rng.choice(self.live())])

    def vanished(self) -> set[bytes]:
        """The transactional records in a partition deleted before their transaction ended."""
        gone: set[bytes] = set()
        for _, parts in self.cluster.graveyard:
            for part in parts:
                pending: dict[int, list[bytes]] = {}
                for batch in part.log:
                    if batch.marker is not None:
                        pending.pop(batch.producer_id, None)
                    elif batch.transactional:
                        pending.setdefault(batch.producer_id, []).extend(batch.values)
                gone.update(v for values in pending.values() for v in values)
        return gone

    def check(self) -> None:
        self.problems.extend(self.cluster.storms)
        super().check()


def run_seed(seed: int, verbose: bool = False, extra: bool = False) -> Run:
    return Run.play(seed, verbose, extra)


if __name__ == "__main__":
    txn_faults.cli(Run, sys.argv)
