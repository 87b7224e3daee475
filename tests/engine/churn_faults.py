"""Seeded randomized harness for the producer under cluster TOPOLOGY churn, on the scripted cluster.

produce_faults.py draws produce *errors*; this one draws what happens to the cluster's shape
while records are sent (send, send_many, some cancelled part-way, flush), in virtual time:
leaders moving between brokers (the old leader then answers NOT_LEADER_OR_FOLLOWER, naming the
new leader or not, KIP-951), a broker failing (its partitions elected elsewhere) and coming back
at the same or another address, a controlled shutdown, two brokers swapping addresses, a
broker's address changing while requests are in flight, a broker joining and taking
leadership, partitions added to a topic, a topic deleted and created again (a new topic id,
maybe with another partition count), brokers whose metadata lags (each answers a past view of
the cluster, never older than one it answered before: leader epochs go back, partitions and
brokers added are missing, a deleted topic is still there), connections dropped mid-request,
requests stalled or held. The producer's settings are drawn too (idempotence on or off, acks,
in-flight limit, linger, batch size, delivery timeout, metadata max age and idle time).

The fake stays an honest Kafka (ChurnCluster): one log per partition whoever leads it, a leader
epoch that only grows, a producer's sequences checked per partition across leaders, a topic
created again starting with empty logs and no producer state. The checks are produce_faults.py's:
every future resolved; with idempotence no record in the log twice and the acknowledged records
of a partition in send order; every acknowledged offset holds its record; no record said not to
be written is in the log; buffer memory given back; the metrics agree.

    PYTHONPATH=. .venv/bin/python tests/engine/churn_faults.py 0 300      (seeds [0, 300))
    PYTHONPATH=. .venv/bin/python tests/engine/churn_faults.py 17 18 -v   (one seed, with its trace)
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import uuid
from dataclasses import dataclass

from aioprod import Producer
from aioprod.errors import BrokerResponseError, KafkaError, KafkaTimeoutError
from aioprod.producer.outcomes import _NOT_WRITTEN
from aioprod.protocol import messages as m
from tests.engine.fault_runs import SeededRun, Violation, command_line, run_in_virtual_time
from tests.engine.produce_faults import HonestCluster, Rec, _queued
from tests.fakes.cluster import NONE, UNKNOWN_TOPIC_OR_PARTITION, FakeNode, Partition

#: Topic -> the leaders of its partitions at the start. "c" is the one most often deleted.
TOPICS = {"a": [1, 2, 3], "b": [2, 3, 1, 2], "c": [3, 1]}
#: Requests within 10 virtual ms that make a storm (a refresh or retry loop that never waits).
STORM = 200


@dataclass(frozen=True)
class View:
    """The cluster's metadata at one moment: what a broker whose cache lags answers."""

    brokers: tuple[tuple[int, str, int], ...]
    topics: dict[str, tuple[uuid.UUID, tuple[tuple[int, int], ...]]]


class ChurnCluster(HonestCluster):
    """The scripted cluster with the topology knobs churn needs, kept honest: every change is a
    new :class:`View`, and a lagging broker answers metadata from a past view no older than the
    last it answered from (a broker's metadata cache only moves forward)."""

    def __init__(self, network, nodes: int) -> None:
        super().__init__(network, nodes=nodes)
        #: Topics deleted, with their partitions (their logs stay for the checks).
        self.graveyard: list[tuple[str, list[Partition]]] = []
        #: Nodes out of the cluster: not in metadata (their leadership was moved first).
        self.retired: set[int] = set()
        self.views: list[View] = []
        #: node -> index of the view it answers from while lagging.
        self.frozen: dict[int, int] = {}
        #: node -> index of the newest view it answered from.
        self.served: dict[int, int] = {}

    # -- views ----------------------------------------------------------------------------

    def snap(self) -> None:
        brokers = tuple((n.node_id, n.host, n.port) for n in self.nodes.values() if n.node_id not in self.retired)
        topics = {
            name: (parts[0].topic_id, tuple((p.leader, p.epoch) for p in parts)) for name, parts in self.topics.items()
        }
        self.views.append(View(brokers, topics))

    def lag(self, node_id: int, back: int) -> int:
        """``node_id`` answers from a view ``back`` changes old, but none older than it answered."""
        now = len(self.views) - 1
        k = max(self.served.get(node_id, 0), now - back, self.frozen.get(node_id, 0))
        self.frozen[node_id] = k
        return now - k

    def _metadata(self, node: FakeNode, request: m.MetadataRequest) -> m.MetadataResponse:
        k = self.frozen.get(node.node_id, len(self.views) - 1)
        self.served[node.node_id] = max(self.served.get(node.node_id, 0), k)
        view = self.views[k]
        names = list(view.topics) if request.topics is None else [t.name for t in request.topics]
        topics = []
        for name in names:
            known = view.topics.get(name)
            if known is None:
                topics.append(m.MetadataResponseTopic(UNKNOWN_TOPIC_OR_PARTITION, name, partitions=[]))
                continue
            topic_id, parts = known
            described = [
                m.MetadataResponsePartition(NONE, i, leader, epoch, [leader], [leader], [])
                for i, (leader, epoch) in enumerate(parts)
            ]
            topics.append(m.MetadataResponseTopic(NONE, name, topic_id=topic_id, partitions=described))
        brokers = [m.MetadataResponseBroker(n, host, port) for n, host, port in view.brokers]
        return m.MetadataResponse(brokers=brokers, cluster_id="scripted", controller_id=1, topics=topics)

    #: Requests answered per 10 ms of virtual time; past STORM the fake answers 10 ms late
    #: (so virtual time moves on: a loop that never waits would stall it) and the run reports it.
    storms: list[str] | None = None
    _window = (0.0, 0)

    async def handle(self, conn, frame):
        if self.storms is not None:
            now = self.clock()
            start, count = self._window
            if now - start > 0.01:
                start, count = now, 0
            self._window = (start, count + 1)
            if count + 1 > STORM:
                if count + 1 == STORM + 1 and not self.storms:
                    kinds = {m.MetadataRequest.API_KEY: "metadata", m.ProduceRequest.API_KEY: "produce"}
                    what = kinds.get(int.from_bytes(frame[:2], "big"), "other")
                    self.storms.append(
                        f"STORM: over {STORM} requests within 10 ms at {now - 1000:.3f} (this one {what})"
                    )
                await asyncio.sleep(0.01)
        return await super().handle(conn, frame)

    def join(self, node_id: int) -> FakeNode:
        """A broker joins: it serves requests once its metadata lists it (it never lags to before)."""
        node = self.add_node(node_id)
        self.snap()
        self.served[node_id] = len(self.views) - 1
        return node

    # -- topology ---------------------------------------------------------------------------

    def move_leader(self, topic: str, index: int, leader: int) -> None:
        super().move_leader(topic, index, leader)
        self.snap()

    def delete_topic(self, name: str) -> None:
        self.graveyard.append((name, self.topics.pop(name)))
        self.snap()

    def recreate_topic(self, name: str, leaders: list[int]) -> None:
        self.create_topic(name, leaders)
        self.snap()

    def add_partitions(self, name: str, leaders: list[int]) -> None:
        parts = self.topics[name]
        parts.extend(Partition(leader, parts[0].topic_id) for leader in leaders)
        self.snap()


class Run(SeededRun):
    def __init__(self, seed: int, verbose: bool = False) -> None:
        super().__init__(seed, verbose)
        self.recs: list[Rec] = []
        self.counter = 0
        self.stopped: set[int] = set()
        #: node -> the addresses it listens on (its advertised one and older ones kept).
        self.listening: dict[int, set[tuple[str, int]]] = {}
        self.calm = False
        self.ticks = 0
        self.background: list[asyncio.Future] = []
        self.opts: dict = {}
        self.metrics: dict = {}
        self.notes: list[str] = []
        self.lanes = False
        self.moves = 0
        self.chaos_mean = self.rng.choice([0.1, 0.5, 2.0, 8.0])
        self.step_fault = self.rng.choice([0.1, 0.3, 0.6])
        #: (topic, partition) explicitly sent to that the producer refused as non-existent.
        self.refused_partitions: list[str] = []

    # -- helpers -----------------------------------------------------------------------------

    def live(self) -> list[int]:
        c = self.cluster
        return [n for n in c.nodes if n not in self.stopped and n not in c.retired]

    def members(self) -> list[int]:
        return [n for n in self.cluster.nodes if n not in self.cluster.retired]

    def _listen(self, n: int) -> None:
        c = self.cluster
        node = c.nodes[n]
        addrs = self.listening.setdefault(n, set())
        addrs.add(node.address)
        for other, theirs in self.listening.items():
            if other != n:
                theirs.discard(node.address)
        if n in self.stopped:
            return
        for host, port in addrs:
            c.network.listen(host, port, node)

    def _unlisten(self, n: int) -> None:
        c = self.cluster
        for host, port in self.listening.get(n, set()):
            if c.network.servers.get((host, port)) is c.nodes[n]:
                c.network.stop_listening(host, port)

    def _stop(self, n: int) -> None:
        self.stopped.add(n)
        self._unlisten(n)
        self.cluster.disconnect(n)

    def _start(self, n: int, new_address: bool = False) -> None:
        if n not in self.stopped:
            return
        node = self.cluster.nodes[n]
        if new_address:
            self.listening[n] = set()
            node.host = f"broker{n}-r{self.moves}.example"
            self.moves += 1
            self.cluster.snap()
        self.log(f"start node {n} at {node.address}")
        self.stopped.discard(n)
        self._listen(n)

    def elect_away(self, n: int) -> None:
        """Every partition ``n`` leads gets another leader among the live members."""
        c, rng = self.cluster, self.rng
        others = [m for m in self.live() if m != n]
        if not others:
            return
        for name, parts in list(c.topics.items()):
            for idx, part in enumerate(parts):
                if part.leader == n:
                    c.move_leader(name, idx, rng.choice(others))

    def pick_partition(self) -> tuple[str, int] | None:
        c = self.cluster
        names = list(c.topics)
        if not names:
            return None
        name = self.rng.choice(names)
        return name, self.rng.randrange(len(c.topics[name]))

    # -- faults --------------------------------------------------------------------------------

    def fault(self) -> None:
        if self.calm:
            return
        c, rng = self.cluster, self.rng
        kind = rng.choice(
            [
                "move_leader",
                "move_leader",
                "move_leader",
                "failover",
                "controlled_shutdown",
                "restart",
                "address",
                "swap",
                "join",
                "add_partitions",
                "delete_topic",
                "recreate_topic",
                "lag",
                "lag",
                "disconnect",
                "hold",
                "stall",
            ]
        )
        loop = asyncio.get_running_loop()
        members = self.members()
        n = rng.choice(members)
        node = c.nodes[n]
        if kind in ("delete_topic", "recreate_topic") and rng.random() < 0.7:
            kind = "move_leader"  # the topic's logs start over: not too often
        if kind == "move_leader":
            tp = self.pick_partition()
            if tp is None:
                return
            to = rng.choice(self.live() or members)
            self.log(f"FAULT leader of {tp[0]}-{tp[1]} -> {to} (epoch {c.topics[tp[0]][tp[1]].epoch + 1})")
            c.move_leader(tp[0], tp[1], to)
        elif kind in ("failover", "controlled_shutdown", "restart"):
            if n in self.stopped or len(self.live()) < 2:
                return
            after = rng.choice([0.05, 1.0, 10.0, 40.0])
            elsewhere = rng.random() < 0.4
            self.log(f"FAULT {kind} node {n} for {after}s{' (back at a new address)' if elsewhere else ''}")
            if kind == "controlled_shutdown":
                self.elect_away(n)  # leaders move first, then the broker goes
                self._stop(n)
            else:
                self._stop(n)
                if kind == "failover":
                    self.elect_away(n)
            loop.call_later(after, self._back, n, elsewhere)
        elif kind == "address":
            mode = rng.choice(["both", "old_gone", "old_cut"])
            old = node.address
            node.host = f"broker{n}-a{self.moves}.example"
            self.moves += 1
            self.log(f"FAULT node {n} moves {old} -> {node.address} ({mode})")
            if mode != "both":
                self._unlisten(n)
                self.listening[n] = set()
                if mode == "old_cut":
                    c.disconnect(n)
            self._listen(n)
            c.snap()
        elif kind == "swap":
            others = [m for m in members if m != n]
            if not others:
                return
            o = rng.choice(others)
            other = c.nodes[o]
            self.log(f"FAULT nodes {n} and {o} swap addresses {node.address} <-> {other.address}")
            for x in (n, o):
                self._unlisten(x)
                self.listening[x] = set()
                c.disconnect(x)
            (node.host, node.port), (other.host, other.port) = other.address, node.address
            self._listen(n)
            self._listen(o)
            c.snap()
        elif kind == "join":
            if len(c.nodes) >= 5:
                return
            k = max(c.nodes) + 1
            c.join(k)
            self._listen(k)
            self.log(f"FAULT node {k} joins at {c.nodes[k].address}")
            for _ in range(rng.randint(1, 3)):
                tp = self.pick_partition()
                if tp is not None:
                    self.log(f"  leader of {tp[0]}-{tp[1]} -> {k}")
                    c.move_leader(tp[0], tp[1], k)
        elif kind == "add_partitions":
            tp = self.pick_partition()
            if tp is None or len(c.topics[tp[0]]) >= 8:
                return
            leaders = [rng.choice(members) for _ in range(rng.randint(1, 3))]
            self.log(f"FAULT topic {tp[0]} gets {len(leaders)} more partitions led by {leaders}")
            c.add_partitions(tp[0], leaders)
        elif kind == "delete_topic":
            name = rng.choice(["c", "c", "a", "b"])
            if name not in c.topics:
                return
            after = rng.choice([None, 0.5, 5.0, 30.0])
            self.log(f"FAULT topic {name} deleted" + ("" if after is None else f", created again after {after}s"))
            c.delete_topic(name)
            if after is not None:
                loop.call_later(after, self._recreate, name)
        elif kind == "recreate_topic":
            name = rng.choice(list(TOPICS))
            if name in c.topics:
                c.delete_topic(name)
            self._recreate(name)
        elif kind == "lag":
            back = rng.choice([1, 2, 5, 50])
            after = rng.choice([0.5, 5.0, 30.0])
            behind = c.lag(n, back)
            self.log(f"FAULT node {n}'s metadata lags {behind} change(s) behind for {after}s")
            loop.call_later(after, self._catch_up, n)
        elif kind == "disconnect":
            self.log(f"FAULT disconnect node {n}")
            c.disconnect(n)
        elif kind in ("hold", "stall"):
            setattr(node, "holding" if kind == "hold" else "stalling", True)
            after = rng.choice([0.01, 0.2, 2.0, 40.0])
            self.log(f"FAULT node {n} {kind}s produce for {after}s")
            loop.call_later(after, c.nodes[n].release)
            if rng.random() < 0.3:  # ... and the leader moves meanwhile
                tp = self.pick_partition()
                if tp is not None and c.topics[tp[0]][tp[1]].leader == n:
                    to = rng.choice(members)
                    self.log(f"  leader of {tp[0]}-{tp[1]} -> {to} while {kind}ing")
                    c.move_leader(tp[0], tp[1], to)

    def _back(self, n: int, elsewhere: bool) -> None:
        if n not in self.stopped:
            return
        self._start(n, new_address=elsewhere)
        if self.rng.random() < 0.5:  # preferred leader election gives it partitions back
            tp = self.pick_partition()
            if tp is not None:
                self.log(f"  leader of {tp[0]}-{tp[1]} -> {n} (back)")
                self.cluster.move_leader(tp[0], tp[1], n)

    def _recreate(self, name: str) -> None:
        c = self.cluster
        if name in c.topics:
            return
        count = self.rng.choice([len(TOPICS[name]), 1, len(TOPICS[name]) + 2])
        leaders = [self.rng.choice(self.members()) for _ in range(count)]
        self.log(f"topic {name} created again with {count} partitions led by {leaders}")
        c.recreate_topic(name, leaders)

    def _catch_up(self, n: int) -> None:
        self.cluster.frozen.pop(n, None)

    async def chaos(self) -> None:
        while True:
            await asyncio.sleep(self.rng.expovariate(1 / self.chaos_mean))
            if self.rng.random() < 0.5:
                self.fault()

    def heal(self) -> None:
        c = self.cluster
        self.calm = True
        c.frozen.clear()
        for n, node in c.nodes.items():
            node.script.clear()
            node.release()
            self._start(n)
        # Every broker is back up (partitions of a failed one were elected elsewhere or wait
        # for it); a deleted topic may come back.
        for name in TOPICS:
            if name not in c.topics and self.rng.random() < 0.5:
                self._recreate(name)

    # -- the workload --------------------------------------------------------------------------

    def value(self) -> bytes:
        self.counter += 1
        r = self.rng.random()
        pad = b"" if r < 0.6 else b":" + b"x" * self.rng.choice([40, 300, 1500])
        return b"%d" % self.counter + pad

    def count(self, topic: str) -> int:
        parts = self.cluster.topics.get(topic)
        return len(parts) if parts else len(TOPICS[topic])

    def refused(self, topic: str, part: int | None, exc: ValueError) -> None:
        parts = self.cluster.topics.get(topic)
        exists = parts is not None and part is not None and part < len(parts)
        self.log(f"  refused ValueError: {exc} (exists now: {exists})")
        if exists:
            self.refused_partitions.append(f"{topic}-{part}: {exc}")

    async def one_send(self, p: Producer) -> None:
        rng = self.rng
        topic = rng.choice(list(TOPICS))
        v = self.value()
        key = rng.choice([None, None, b"k1", b"k2", b"k3"])
        part = rng.choice([None, None, rng.randrange(self.count(topic))])
        rec = Rec(v, topic)
        self.ticks += 1
        rec.start = rec.call = self.ticks
        self.recs.append(rec)
        cancel = rng.choice([None] * 9 + [0.0, 0.01, 0.3])
        self.log(f"send {topic} {v[:12]!r} key={key} partition={part} cancel={cancel}")
        call = p.send(topic, v, key=key, partition=part)
        try:
            if cancel is None:
                rec.future = await self.guarded("send", call)
            else:
                rec.future = await asyncio.wait_for(call, cancel)
            self.ticks += 1
            rec.end = self.ticks
        except KafkaError as exc:
            rec.queued = False
            self.log(f"  send raised {type(exc).__name__}: {exc}")
        except ValueError as exc:
            rec.queued = False
            self.refused(topic, part, exc)
        except TimeoutError:
            rec.queued = False
            self.log("  send cancelled by wait_for")

    async def one_send_many(self, p: Producer) -> None:
        rng = self.rng
        topic = rng.choice(list(TOPICS))
        n = rng.randint(1, 12)
        vals = [self.value() for _ in range(n)]
        keys = [rng.choice([b"k1", b"k2", b"k3", None]) for _ in range(n)] if rng.random() < 0.3 else None
        part = rng.randrange(self.count(topic)) if keys is None and rng.random() < 0.5 else None
        recs = [Rec(v, topic) for v in vals]
        self.ticks += 1
        for i, r in enumerate(recs):
            r.start = r.call = self.ticks
            r.index = i
        self.recs.extend(recs)
        cancel = rng.choice([None] * 6 + [0.0, 0.001, 0.05, 0.5])
        self.log(f"send_many {topic} {len(vals)} records keys={keys is not None} partition={part} cancel={cancel}")
        call = p.send_many(topic, vals, keys=keys, partition=part)
        try:
            if cancel is None:
                fut = await self.guarded("send_many", call)
            else:
                fut = await asyncio.wait_for(call, cancel)
        except KafkaError as exc:
            for r in recs:
                r.queued = False
            self.log(f"  send_many raised {type(exc).__name__}: {exc}")
            return
        except ValueError as exc:
            for r in recs:
                r.queued = False
            self.refused(topic, part, exc)
            return
        except TimeoutError as exc:
            queued = getattr(exc.__cause__, "_aioprod_queued", None)
            count, fut = queued if queued is not None else (0, None)
            self.log(f"  send_many cancelled by wait_for after queuing {count}")
            self.ticks += 1
            for i, r in enumerate(recs):
                if i < count:
                    r.group = (fut, i)
                    r.end = self.ticks
                else:
                    r.queued = False
            return
        self.ticks += 1
        for i, r in enumerate(recs):
            r.group = (fut, i)
            r.end = self.ticks

    async def workload(self, p: Producer) -> None:
        workers = self.rng.choice([1, 1, 2, 3])
        if workers == 1:
            await self.worker(p, self.rng.randint(10, 40))
            return
        self.log(f"{workers} workers")
        await asyncio.gather(*(self.worker(p, self.rng.randint(5, 20)) for _ in range(workers)))

    async def worker(self, p: Producer, steps: int) -> None:
        rng = self.rng
        for _ in range(steps):
            if rng.random() < self.step_fault:
                self.fault()
            r = rng.random()
            if r < 0.1:
                self.log("background send")
                self.background.append(asyncio.ensure_future(self.one_send(p)))
            elif r < 0.5:
                await self.one_send(p)
            elif r < 0.75:
                await self.one_send_many(p)
            elif r < 0.9:
                await asyncio.sleep(rng.choice([0.001, 0.05, 0.5, 3.0, 8.0]))
            else:
                timeout = rng.choice([None, None, 0.0, 1.0])
                self.log(f"flush timeout={timeout}")
                try:
                    await self.guarded("flush", p.flush(timeout))
                except KafkaTimeoutError as exc:
                    self.log(f"  flush: {exc}")

    def options(self) -> dict:
        rng = self.rng
        idem = rng.random() < 0.6
        opts: dict = {
            "enable_idempotence": idem,
            "acks": "all" if idem else rng.choice(["all", 1, 1, 0]),
            "max_in_flight_requests_per_connection": rng.choice([1, 2, 5]),
            "linger_ms": rng.choice([0, 5, 50]),
            "batch_size": rng.choice([200, 1000, 16384]),
            "request_timeout_ms": rng.choice([30_000, 1_000]),
            "retry_backoff_ms": rng.choice([10, 100]),
            "max_block_ms": rng.choice([60_000, 2_000, 200]),
            "metadata_max_age_ms": rng.choice([300_000, 1_000, 100]),
            "metadata_max_idle_ms": rng.choice([300_000, 5_000]),
            "reconnect_backoff_ms": rng.choice([50, 500]),
        }
        least = opts["request_timeout_ms"] + opts["linger_ms"]
        opts["delivery_timeout_ms"] = rng.choice([120_000, max(30_000, least), least + rng.choice([5, 2000])])
        if rng.random() < 0.3:
            opts["buffer_memory"] = rng.choice([4000, 12000])
        return opts

    async def main(self) -> None:
        loop = asyncio.get_running_loop()
        self.t0 = loop.time()
        from tests.fakes.network import MemoryNetwork

        network = MemoryNetwork()
        asyncio.open_connection = network.open_connection  # type: ignore[assignment]
        c = self.cluster = ChurnCluster(network, nodes=3)
        c.on_answer = self.log if self.verbose else None
        c.storms = []
        for t, leaders in TOPICS.items():
            c.create_topic(t, leaders=leaders)
        for n in c.nodes:
            self.listening[n] = {c.nodes[n].address}
        c.snap()
        rng = self.rng
        opts = self.opts = self.options()
        c.duplicate_error = rng.random() < 0.25
        c.kip951 = rng.random() < 0.6
        c.accepts_unknown_producers = rng.random() < 0.5
        self.log(
            f"options {opts} dup_error={c.duplicate_error} kip951={c.kip951} "
            f"accepts_unknown_producers={c.accepts_unknown_producers} lanes={self.lanes}"
        )
        p = self.producer = Producer(bootstrap_servers=c.bootstrap, **opts)
        p._partitioner._random = random.Random(self.seed)
        if not self.lanes:
            p._lanes_on = False
        try:
            await self.guarded("start", p.start())
        except KafkaError as exc:
            self.problems.append(f"start failed {exc!r}")
            return
        if self.verbose:
            self.trace_sender(p)
        chaos = asyncio.ensure_future(self.chaos())
        try:
            await self.workload(p)
        except Violation:
            pass
        finally:
            chaos.cancel()
            close_timeout = rng.choice([None, None, None, 0, 0.5, 5.0])
            if rng.random() < 0.5:
                self.log("heal before close")
                self.heal()
            self.log(f"close timeout={close_timeout}")
            with contextlib.suppress(Violation):
                await self.guarded("close", p.close(close_timeout))
            self.metrics = p.metrics()
            self.check_closed(p)
            self.heal()
            for task in self.background:
                if not task.done():
                    self.problems.append("HANG: a background send never returned")
                    task.cancel()
        await asyncio.sleep(2.0)
        self.problems.extend(c.storms)
        self.check()

    def trace_sender(self, p: Producer) -> None:
        sender = p._sender
        send, on_response = sender._send, sender._on_response

        def describe(batches) -> str:
            return ", ".join(
                f"{b.tp.topic}-{b.tp.partition}:{b.producer_id}/{b.producer_epoch}/{b.base_sequence}x{b.record_count}"
                for b in batches
            )

        def traced_send(conn, batches, cluster, now):
            send(conn, batches, cluster, now)
            self.log(f"> node {conn.node_id} {conn.host}:{conn.port}: {describe(batches)}")

        def traced_on_response(batches, answer, node, sent_at):
            what = type(answer).__name__ if not isinstance(answer, BaseException) else repr(answer)[:100]
            self.log(f"< node {node} (sent {sent_at - self.t0:.3f}) {what}: {describe(batches)}")
            on_response(batches, answer, node, sent_at)

        sender._send = traced_send
        sender._on_response = traced_on_response

    # -- the checks ------------------------------------------------------------------------------

    def check_closed(self, p: Producer) -> None:
        for rec in self.recs:
            if rec.queued and self.outcome(rec) == "pending":
                self.problems.append(f"HANG: record {rec.value[:12]!r} unresolved after close()")
        acc = p._accumulator
        if acc.pool.used != 0:
            self.problems.append(f"MEMORY: {acc.pool.used} bytes of buffer_memory still reserved after close()")
        if acc.incomplete or acc.open_batches:
            self.problems.append(
                f"LEFTOVER: {len(acc.incomplete)} incomplete batches, {len(acc.open_batches)} queues after close()"
            )

    def check(self) -> None:
        c, opts = self.cluster, self.opts
        idem = opts["enable_idempotence"]
        acks0 = opts["acks"] == 0
        ordered = idem or (opts["max_in_flight_requests_per_connection"] == 1 and not acks0)
        by_value = {r.value: r for r in self.recs}
        #: value -> [(topic, partition, offset, incarnation)]
        raw: dict[bytes, list[tuple[str, int, int, int]]] = {}
        log_count = 0
        incarnations = [*c.graveyard, *c.topics.items()]
        for inc, (t, parts) in enumerate(incarnations):
            for idx, part in enumerate(parts):
                for batch in part.log:
                    for j, v in enumerate(batch.values):
                        raw.setdefault(v, []).append((t, idx, batch.base_offset + j, inc))
                        log_count += 1
        if idem:
            for v, where in raw.items():
                if len(where) > 1:
                    # A copy in a deleted topic is gone with it: written again into the topic
                    # created since (a retry of an attempt whose answer never came) is no duplicate.
                    same = len({w[3] for w in where}) < len(where)
                    (self.problems if same else self.notes).append(
                        f"DUPLICATE: {v[:12]!r} written {len(where)} times: {where}"
                    )
        for v in raw:
            if v not in by_value:
                self.problems.append(f"UNKNOWN record {v[:12]!r} in the log")
        acked: dict[tuple[str, int, int], list[tuple[int, Rec]]] = {}
        failed_queued = 0
        acked_count = 0
        for rec in self.recs:
            out = self.outcome(rec)
            where = raw.get(rec.value, [])
            if not rec.queued:
                if where:
                    self.problems.append(
                        f"NOT-QUEUED-WRITTEN: {rec.value[:12]!r} (its call raised) is in the log {where}"
                    )
                continue
            if out == "pending":
                continue
            if isinstance(out, tuple):
                acked_count += 1
                if acks0:
                    continue
                mine = [w for w in where if w[:2] == (out.topic, out.partition)]
                at = [w for w in mine if w[2] == out.offset]
                if out.offset == -1 and c.duplicate_error and mine:
                    w = mine[0]
                elif not at:
                    self.problems.append(
                        f"ACK-LIE: {rec.value[:12]!r} acked at {out.topic}-{out.partition}@{out.offset}, "
                        f"log has {where}"
                    )
                    continue
                else:
                    w = at[0]
                acked.setdefault((w[0], w[1], w[3]), []).append((w[2], rec))
            elif isinstance(out, BaseException):
                if _queued(out):
                    failed_queued += 1
                pp = getattr(out, "possibly_persisted", None)
                if pp is False and where:
                    self.problems.append(
                        f"ERROR-LIE: {rec.value[:12]!r} failed {type(out).__name__}(possibly_persisted=False) "
                        f"but is in the log {where}: {out}"
                    )
                elif (
                    pp is None
                    and isinstance(out, BrokerResponseError)
                    and out.code in _NOT_WRITTEN
                    and where
                    and "may be in the log" not in str(out)
                ):
                    (self.problems if not out.retriable else self.notes).append(
                        f"BROKER-ERROR-LIE: {rec.value[:12]!r} failed {type(out).__name__} (not written, says the "
                        f"code) but is in the log {where}"
                    )
                if not isinstance(out, KafkaError):
                    self.problems.append(f"record {rec.value[:12]!r} failed with non-Kafka {out!r}")
        if ordered:
            for tp, items in acked.items():
                items.sort(key=lambda x: x[0])
                for i, (pa, a) in enumerate(items):
                    for pb, b in items[i + 1 :]:
                        if b.end < a.start or (b.call == a.call and b.index < a.index):
                            self.problems.append(
                                f"ORDER: {tp[0]}-{tp[1]} (incarnation {tp[2]}) has {a.value[:12]!r}@{pa} "
                                f"before {b.value[:12]!r}@{pb}"
                            )
        m_ = self.metrics
        if m_["record-error-total"] != failed_queued:
            self.problems.append(f"METRICS: record-error-total {m_['record-error-total']} but {failed_queued} failed")
        if not acks0 and m_["record-send-total"] < log_count:
            self.problems.append(f"METRICS: record-send-total {m_['record-send-total']} < {log_count} records written")
        if not acks0 and m_["record-send-total"] < acked_count:
            self.problems.append(f"METRICS: record-send-total {m_['record-send-total']} < {acked_count} acknowledged")
        for r in self.refused_partitions:
            self.notes.append(f"REFUSED-EXISTING-PARTITION: {r}")


def run_seed(seed: int, verbose: bool = False) -> Run:
    run = Run(seed, verbose)
    run.lanes = run.rng.random() < 0.3
    run_in_virtual_time(seed, run.main, run.problems, pin_timestamps=not run.lanes)
    return run


if __name__ == "__main__":
    notes = "--notes" in sys.argv

    def describe(run: Run) -> str:
        extra = "".join(f"\n    note: {n[:300]}" for n in run.notes) if notes else ""
        return f"{len(run.recs)} records {run.opts}{extra}"

    command_line(run_seed, describe, [a for a in sys.argv if a != "--notes"])
