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
created again starting with empty logs and no producer state. The workload, the run and the
checks are produce_faults.py's (Run here subclasses its Run: churn's faults, topics and draws go
in through its hooks): every future resolved; with idempotence no record in the log twice and
the acknowledged records of a partition in send order; every acknowledged offset holds its
record; no record said not to be written is in the log; buffer memory given back; the metrics
agree; no request storm.

    PYTHONPATH=. .venv/bin/python tests/engine/churn_faults.py 0 300      (seeds [0, 300))
    PYTHONPATH=. .venv/bin/python tests/engine/churn_faults.py 17 18 -v   (one seed, with its trace)
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from dataclasses import dataclass

from aioprod.protocol import messages as m
from tests.engine import produce_faults
from tests.engine.fault_runs import command_line
from tests.engine.produce_faults import HonestCluster, Rec
from tests.fakes.cluster import FakeNode, Partition

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

    def metadata_view(self, node: FakeNode) -> tuple[tuple[tuple[int, str, int], ...], dict]:
        """A lagging node answers from its frozen view, the others from the newest."""
        k = self.frozen.get(node.node_id, len(self.views) - 1)
        self.served[node.node_id] = max(self.served.get(node.node_id, 0), k)
        view = self.views[k]
        return view.brokers, view.topics

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


class Run(produce_faults.Run):
    """One seed's run under topology churn: produce_faults.py's workload, run and checks, with
    churn's faults on a :class:`ChurnCluster`."""

    TOPICS = TOPICS
    Cluster = ChurnCluster
    CHAOS_MEANS = [0.1, 0.5, 2.0, 8.0]
    PAUSES = [0.001, 0.05, 0.5, 3.0, 8.0]
    HEADERS = False
    KIP951 = 0.6
    #: A send to a partition the producer's metadata does not have (yet, or any more) is refused.
    REFUSALS = (ValueError,)
    #: The faults the chaos and the workers draw from (one name a chance).
    FAULTS = [
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
    #: produce_faults.py's broken answers but a cluster replaced (the views a lagging broker
    #: answers from are this cluster's).
    BROKEN_KINDS = [kind for kind in produce_faults.BROKEN if kind != "swap"]
    cluster: ChurnCluster

    def __init__(self, seed: int, verbose: bool = False) -> None:
        super().__init__(seed, verbose)
        #: node -> the addresses it listens on (its advertised one and older ones kept).
        self.listening: dict[int, set[tuple[str, int]]] = {}
        self.moves = 0
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

    def fault_targets(self) -> list[int]:
        return self.members()

    def inflict(self, kind: str, n: int) -> None:
        if isinstance(self, Run) and self.broken.random() < self.broken_odds:  # (not txn_churn_faults.py's)
            self.brake()
        c, rng = self.cluster, self.rng
        loop = asyncio.get_running_loop()
        members = self.members()
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

    def heal(self) -> None:
        c = self.cluster
        self.calm = True
        c.frozen.clear()
        c.mangles.clear()
        c.blank_inits.clear()
        c.bad_partitions.clear()
        for n, node in c.nodes.items():
            node.script.clear()
            node.release()
            self._start(n)
        # Every broker is back up (partitions of a failed one were elected elsewhere or wait
        # for it); a deleted topic may come back.
        for name in TOPICS:
            if name not in c.topics and self.rng.random() < 0.5:
                self._recreate(name)

    # -- hooks -------------------------------------------------------------------------------

    def cluster_built(self) -> None:
        c = self.cluster
        c.storms = []
        for n in c.nodes:
            self.listening[n] = {c.nodes[n].address}
        c.snap()

    def connection(self, conn) -> str:
        return f"{conn.host}:{conn.port}"

    def count(self, topic: str) -> int:
        parts = self.cluster.topics.get(topic)
        return len(parts) if parts else len(TOPICS[topic])

    def refused(self, topic: str, part: int | None, exc: ValueError) -> None:
        parts = self.cluster.topics.get(topic)
        exists = parts is not None and part is not None and part < len(parts)
        self.log(f"  refused ValueError: {exc} (exists now: {exists})")
        if exists:
            self.refused_partitions.append(f"{topic}-{part}: {exc}")

    # -- the checks ------------------------------------------------------------------------------

    def generation_of(self, where: tuple) -> int:
        return 0  # the cluster is never replaced here: an incarnation is a topic's

    def incarnations(self) -> list[tuple[str, list, tuple[int, ...]]]:
        """Every topic's logs, a deleted one's too: records are told apart by incarnation."""
        c = self.cluster
        return [(t, parts, (inc,)) for inc, (t, parts) in enumerate([*c.graveyard, *c.topics.items()])]

    def check(self) -> None:
        self.problems.extend(self.cluster.storms)
        super().check()
        for r in self.refused_partitions:
            self.notes.append(f"REFUSED-EXISTING-PARTITION: {r}")

    def check_order(
        self, acked: dict[tuple, list[tuple[int, Rec]]], raw: dict[bytes, list[tuple]], by_value: dict[bytes, Rec]
    ) -> None:
        """The acknowledged records of an incarnation of a partition are in the order of their sends."""
        for tp, items in acked.items():
            items.sort(key=lambda x: x[0])
            for i, (pa, a) in enumerate(items):
                for pb, b in items[i + 1 :]:
                    if b.end < a.start or (b.call == a.call and b.index < a.index):
                        self.problems.append(
                            f"ORDER: {tp[0]}-{tp[1]} (incarnation {tp[2]}) has {a.value[:12]!r}@{pa} "
                            f"before {b.value[:12]!r}@{pb}"
                        )

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
        opts["connections_max_idle_ms"] = self.later_rng.choice(produce_faults.IDLE_LIMITS_MS)
        least = opts["request_timeout_ms"] + opts["linger_ms"]
        opts["delivery_timeout_ms"] = rng.choice([120_000, max(30_000, least), least + rng.choice([5, 2000])])
        if rng.random() < 0.3:
            opts["buffer_memory"] = rng.choice([4000, 12000])
        return opts


def run_seed(seed: int, verbose: bool = False, broken: bool = True) -> Run:
    return Run.play(seed, verbose, broken)


if __name__ == "__main__":
    notes = "--notes" in sys.argv

    def describe(run: Run) -> str:
        extra = "".join(f"\n    note: {n[:300]}" for n in run.notes) if notes else ""
        return f"{len(run.recs)} records {run.opts}{extra}"

    command_line(run_seed, describe, [a for a in sys.argv if a != "--notes"])
