"""Seeded randomized fault harness for the transactional producer on the scripted cluster.

Each seed runs a few transactions (send, send_many, send_offsets_to_transaction, commit or
abort, retried or cancelled) under random produce and coordinator faults in virtual time, then
checks the committed view, every future's outcome and every error's truth. The suite runs a
few seeds (test_txn_faults.py); for a long hunt:

    PYTHONPATH=. .venv/bin/python tests/engine/txn_faults.py 0 300      (seeds [0, 300))
    PYTHONPATH=. .venv/bin/python tests/engine/txn_faults.py 17 18 -v   (one seed, with its trace)
    ... -x: background sends across commits, buffer pressure, close() with a timeout

Some seeds draw broken answers too (Run.BROKEN): produce answers missing, repeating or misnaming
a partition, FindCoordinator answers naming no node, InitProducerId answers without an id, metadata
naming partition ids outside 0..n-1; the checks are the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
from collections import deque
from dataclasses import dataclass, field

from aioprod import Producer, TopicPartition
from aioprod.errors import (
    KafkaError,
    KafkaTimeoutError,
    ProducerFatalError,
    TransactionAbortableError,
    TransactionStateError,
)
from aioprod.protocol import messages as m
from tests.engine.fault_runs import SeededRun, Violation, break_metadata, command_line, run_in_virtual_time
from tests.engine.produce_faults import BAD_PARTITION_IDS, INIT_STORM, MANGLES
from tests.fakes.cluster import ScriptedCluster
from tests.fakes.coordinator import Lost

TOPICS = {"a": [1, 2, 3], "b": [2, 3]}
PRODUCE_ERRORS = [6, 19, 7, 45, 47, 120]
COORD_ERRORS = [16, 14, 51, 7, Lost]
COORD_APIS = [
    m.AddPartitionsToTxnRequest.API_KEY,
    m.AddOffsetsToTxnRequest.API_KEY,
    m.TxnOffsetCommitRequest.API_KEY,
    m.EndTxnRequest.API_KEY,
    m.FindCoordinatorRequest.API_KEY,
]


@dataclass
class Rec:
    value: bytes
    txn: int
    topic: str
    future: object = None  # RecordFuture
    group: object = None  # (SendGroup future, index)
    queued: bool = True
    start: int = 0
    end: int = 1 << 60
    call: int = 0
    index: int = 0


@dataclass
class Txn:
    index: int
    records: list[Rec] = field(default_factory=list)
    offsets: dict = field(default_factory=dict)  # (topic, p) -> offset, for group "g"
    status: str = "open"  # committed / aborted / unknown


class HonestCluster(ScriptedCluster):
    """A scripted sequence or epoch refusal (45, 47) is not given to a retry of a batch the
    partition already holds: a real broker answers that as a duplicate (it checks for
    duplicates first).

    Broken answers (Run.brake), as produce_faults.py's: a produce answer broken for one
    partition after the request was handled as usual (MANGLES), FindCoordinator answers naming
    no node without an error, InitProducerId answers without an id or epoch and without an
    error (the coordinator acted on none of them), metadata naming a partition id outside
    0..n-1 (or a broker id -1)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        #: node -> how its next produce answers are broken, one partition of each (MANGLES).
        self.mangles: dict[int, deque[str]] = {}
        self.mangle_rng = random.Random(0)
        #: How many of the next FindCoordinator answers name no node (-1, "", -1), error 0.
        self.blank_finds = 0
        #: (producer id, epoch) the next InitProducerId answers give, without an error.
        self.blank_inits: deque[tuple[int, int]] = deque()
        #: node -> (how, topic, partition index, bad id): see produce_faults.HonestCluster.
        self.bad_partitions: dict[int, tuple[str, str, int, int | None]] = {}
        #: When each InitProducerId and FindCoordinator request came (virtual time).
        self.asked: dict[str, list[float]] = {"InitProducerId": [], "FindCoordinator": []}
        coordinator = self.coordinator
        find, init = coordinator.find, coordinator.init_producer_id

        def finding(request):
            self.asked["FindCoordinator"].append(self.clock())
            response = find(request)
            if self.blank_finds and not response.error_code:
                self.blank_finds -= 1
                for found in response.coordinators:
                    found.node_id, found.host, found.port = -1, "", -1
                response.node_id, response.host, response.port = -1, "", -1
            return response

        def initializing(txn_id, request):
            self.asked["InitProducerId"].append(self.clock())
            if self.blank_inits:
                producer_id, epoch = self.blank_inits.popleft()
                return m.InitProducerIdResponse(producer_id=producer_id, producer_epoch=epoch)
            return init(txn_id, request)

        coordinator.find = finding
        coordinator.init_producer_id = initializing

    def _metadata(self, node, request):
        response = super()._metadata(node, request)
        break_metadata(response, self.bad_partitions.get(node.node_id))
        return response

    def _produce(self, node, request, version):
        response, hold = self._produce_honestly(node, request, version)
        mangles = self.mangles.get(node.node_id)
        entries = [(t, part) for t in response.responses for part in t.partition_responses]
        if mangles and entries and request.acks != 0:
            how, rng = mangles.popleft(), self.mangle_rng
            t, part = rng.choice(entries)
            if how == "omit":
                t.partition_responses.remove(part)
            elif how == "repeat":
                other = m.ProduceResponsePartition(index=part.index, error_code=rng.choice([7, 6]), base_offset=-1)
                t.partition_responses.insert(rng.choice([0, len(t.partition_responses)]), other)
            elif how == "case":
                t.partition_responses.remove(part)
                response.responses.append(m.ProduceResponseTopic(name=t.name.upper(), partition_responses=[part]))
            else:  # "stray"
                t.partition_responses.append(m.ProduceResponsePartition(index=99, error_code=0, base_offset=0))
        return response, hold

    def _produce_honestly(self, node, request, version):
        from aioprod.protocol.records import read_batch

        if node.script:
            script = list(node.script)
            i = 0
            for t in request.topic_data:
                for p in t.partition_data:
                    if i >= len(script):
                        break
                    if script[i] in (45, 47):
                        batch = read_batch(p.records)
                        parts = self.topics.get(t.name)
                        if parts is not None and p.index < len(parts):
                            for b in parts[p.index].log:
                                if (b.producer_id, b.producer_epoch, b.base_sequence) == (
                                    batch.producer_id,
                                    batch.producer_epoch,
                                    batch.base_sequence,
                                ) and b.marker is None:
                                    script[i] = 0
                                    break
                    i += 1
            node.script = deque(script)
        return super()._produce(node, request, version)


class Run(SeededRun):
    #: Topic -> the leaders of its partitions at the start.
    TOPICS = TOPICS
    #: The cluster the run sends to.
    Cluster: type[ScriptedCluster] = HonestCluster
    #: What send() and send_many() may raise that is not a KafkaError (nothing here: a crash).
    REFUSALS: tuple[type[Exception], ...] = ()

    def __init__(self, seed: int, verbose: bool, options: dict | None = None, faults: bool = True) -> None:
        super().__init__(seed, verbose)
        self.txns: list[Txn] = []
        self.counter = 0
        self.options = options
        self.faults = faults
        self.stopped: set[int] = set()
        self.calm = False
        self.ticks = 0
        self.extra = False
        self.background: list = []
        self.chaos_mean = self.rng.choice([0.002, 0.02, 0.2])
        self.step_fault = self.rng.choice([0.1, 0.3, 0.6])
        #: Broken answers come with a fault this likely (see produce_faults.Run.BROKEN_ODDS), drawn
        #: from a stream of their own: a seed that draws 0 runs as before.
        self.broken = random.Random(f"broken-{seed}")
        self.broken_odds = self.broken.choice(self.BROKEN_ODDS)

    #: How likely a fault comes with a broken answer, one drawn a seed.
    BROKEN_ODDS = [0.0, 0.0, 0.1, 0.3]
    #: The broken answers drawn (a cluster replaced is fatal to a transactional producer: not here).
    BROKEN = ["mangle", "mangle", "find", "init", "bad_partition"]

    def brake(self, first: bool = False) -> None:
        """A broken answer of one kind (BROKEN); ``first``: before start(), few enough that
        start() may still initialise within max_block_ms."""
        c, rng = self.cluster, self.broken
        kind = rng.choice(self.BROKEN)
        counts = [1, 3] if first else [1, 3, 30]
        n = rng.choice(list(c.nodes))
        if kind == "mangle":
            how, times = rng.choice(MANGLES), rng.choice([1, 1, 3])
            c.mangles.setdefault(n, deque()).extend([how] * times)
            self.log(f"FAULT node {n}'s next {times} produce answer(s) broken: {how}")
        elif kind == "find":
            c.blank_finds += rng.choice(counts)
            self.log(f"FAULT the next {c.blank_finds} FindCoordinator answers name no node")
        elif kind == "init":
            blank = rng.choice([(-1, -1), (-1, 0), (5000, -1)])
            times = rng.choice(counts)
            c.blank_inits.extend([blank] * times)
            self.log(f"FAULT the next {times} InitProducerId answers are {blank} without an error")
        else:
            topic = rng.choice(list(self.TOPICS))
            spec = (
                rng.choice(["extra", "extra", "broker"]),
                topic,
                rng.randrange(len(self.TOPICS[topic])),
                rng.choice([None, *BAD_PARTITION_IDS]),
            )
            c.bad_partitions[n] = spec
            after = rng.choice([0.5, 5.0, 30.0])
            self.log(f"FAULT node {n}'s metadata is broken for {after}s: {spec}")
            asyncio.get_running_loop().call_later(after, self._mend_metadata, n, spec)

    def _mend_metadata(self, n: int, spec: tuple) -> None:
        if self.cluster.bad_partitions.get(n) == spec:
            del self.cluster.bad_partitions[n]

    @classmethod
    def play(cls, seed: int, verbose: bool = False, extra: bool = False, broken: bool = True) -> Run:
        """Run seed ``seed``: a fresh run of this class in virtual time (``extra``: see -x;
        ``broken=False``: without broken answers, as the seed ran before they were drawn)."""
        run = cls(seed, verbose)
        run.extra = extra
        if not broken:
            run.broken_odds = 0.0
        run_in_virtual_time(seed, run.main, run.problems)
        return run

    # -- faults --------------------------------------------------------------------------------

    def fault(self) -> None:
        if self.broken.random() < self.broken_odds:
            self.brake()
        c, rng = self.cluster, self.rng
        kind = rng.choice(
            [
                "produce_err",
                "produce_err",
                "coord_err",
                "coord_err",
                "hold",
                "stall",
                "disconnect",
                "stop",
                "move_leader",
                "move_coord",
                "delay",
            ]
        )
        loop = asyncio.get_running_loop()
        nodes = list(c.nodes)
        if kind == "produce_err":
            n = rng.choice(nodes)
            code = rng.choice(PRODUCE_ERRORS)
            c.nodes[n].script.append(code)
            self.log(f"FAULT node {n} next produce partition answers {code}")
        elif kind == "coord_err":
            api = rng.choice(COORD_APIS)
            code = rng.choice(COORD_ERRORS) if api != m.FindCoordinatorRequest.API_KEY else rng.choice([15, 14])
            c.coordinator.script.setdefault(api, deque()).append(code)
            self.log(f"FAULT coordinator api {api} next answers {getattr(code, '__name__', code)}")
        elif kind == "hold":
            n = rng.choice(nodes)
            node = c.nodes[n]
            node.holding = True
            after = rng.choice([0.01, 0.2, 2.0, 40.0])
            self.log(f"FAULT node {n} holds produce answers for {after}s")
            loop.call_later(after, self._release, n)
        elif kind == "stall":
            n = rng.choice(nodes)
            c.nodes[n].stalling = True
            after = rng.choice([0.01, 0.2, 2.0, 40.0])
            self.log(f"FAULT node {n} stalls produce for {after}s")
            loop.call_later(after, self._release, n)
        elif kind == "disconnect":
            n = rng.choice(nodes)
            self.log(f"FAULT disconnect node {n}")
            c.disconnect(n)
        elif kind == "stop":
            n = rng.choice(nodes)
            if n in self.stopped:
                return
            after = rng.choice([0.05, 1.0, 10.0])
            self.log(f"FAULT stop node {n} for {after}s")
            self.stopped.add(n)
            c.stop(n)
            loop.call_later(after, self._start, n)
        elif kind == "move_leader":
            topic = rng.choice(list(TOPICS))
            idx = rng.randrange(len(TOPICS[topic]))
            new = rng.choice(nodes)
            self.log(f"FAULT leader of {topic}-{idx} -> {new}")
            c.move_leader(topic, idx, new)
        elif kind == "move_coord":
            new = rng.choice(nodes)
            self.log(f"FAULT coordinator -> node {new}")
            c.coordinator.move_to(new)
        elif kind == "delay":
            n = rng.choice(nodes)
            d = rng.choice([0.05, 0.5])
            c.nodes[n].delay = d
            self.log(f"FAULT node {n} delays produce answers {d}s")
            loop.call_later(rng.choice([0.5, 3.0]), self._undelay, n)

    def _release(self, n: int) -> None:
        self.log(f"release node {n}")
        self.cluster.nodes[n].release()

    def _undelay(self, n: int) -> None:
        self.cluster.nodes[n].delay = 0.0

    def _start(self, n: int) -> None:
        self.log(f"start node {n}")
        self.stopped.discard(n)
        self.cluster.start(n)

    async def chaos(self) -> None:
        while True:
            await asyncio.sleep(self.rng.expovariate(1 / self.chaos_mean))
            if self.rng.random() < 0.5 and not self.calm:
                self.fault()

    def calls(self) -> int:
        """How many times a call that timed out is made again before the run calls it a hang."""
        return 30

    def maybe_calm(self, attempt: int) -> None:
        if attempt == 3 and not self.calm:
            self.log("CALM: no more faults, cluster healed")
            self.calm = True
            self.heal()

    def heal(self) -> None:
        c = self.cluster
        for n, node in c.nodes.items():
            node.script.clear()
            node.release()
            node.delay = 0.0
            if n in self.stopped:
                c.start(n)
        self.stopped.clear()
        c.coordinator.script.clear()
        if isinstance(c, HonestCluster):
            c.mangles.clear()
            c.blank_inits.clear()
            c.bad_partitions.clear()
            c.blank_finds = 0

    # -- the workload --------------------------------------------------------------------------

    def value(self, txn: Txn) -> bytes:
        self.counter += 1
        pad = b"" if not self.extra or self.rng.random() < 0.5 else b":" + b"x" * self.rng.choice([100, 1500])
        return b"%d:%d" % (txn.index, self.counter) + pad

    def count(self, topic: str) -> int:
        """How many partitions the workload takes ``topic`` to have."""
        return len(self.TOPICS[topic])

    def refused(self, topic: str, part: int | None, exc: Exception) -> None:
        """A send or send_many raised one of REFUSALS."""

    async def one_send(self, p: Producer, txn: Txn) -> None:
        rng = self.rng
        topic = rng.choice(list(self.TOPICS))
        if rng.random() < 0.6:
            v = self.value(txn)
            key = rng.choice([None, b"k1", b"k2", b"k3"])
            part = rng.choice([None, None, rng.randrange(self.count(topic))]) if key is None else None
            rec = Rec(v, txn.index, topic)
            self.ticks += 1
            rec.start = rec.call = self.ticks
            txn.records.append(rec)
            self.log(f"send {topic} {v!r} key={key} partition={part}")
            try:
                rec.future = await self.guarded("send", p.send(topic, v, key=key, partition=part))
                self.ticks += 1
                rec.end = self.ticks
            except KafkaError as exc:
                rec.queued = False
                self.log(f"  send raised {type(exc).__name__}: {exc}")
                return
            except self.REFUSALS as exc:
                rec.queued = False
                self.refused(topic, part, exc)
                return
        else:
            n = rng.randint(1, 6)
            vals = [self.value(txn) for _ in range(n)]
            keys = [rng.choice([b"k1", b"k2", b"k3"]) for _ in range(n)] if rng.random() < 0.3 else None
            part = rng.randrange(self.count(topic)) if keys is None and rng.random() < 0.5 else None
            recs = [Rec(v, txn.index, topic) for v in vals]
            self.ticks += 1
            for i, r in enumerate(recs):
                r.start = r.call = self.ticks
                r.index = i
            txn.records.extend(recs)
            self.log(f"send_many {topic} {vals} keys={keys} partition={part}")
            try:
                fut = await self.guarded("send_many", p.send_many(topic, vals, keys=keys, partition=part))
            except KafkaError as exc:
                for r in recs:
                    r.queued = False
                self.log(f"  send_many raised {type(exc).__name__}: {exc}")
                return
            except self.REFUSALS as exc:
                for r in recs:
                    r.queued = False
                self.refused(topic, part, exc)
                return
            self.ticks += 1
            for i, r in enumerate(recs):
                r.group = (fut, i)
                r.end = self.ticks

    async def offsets(self, p: Producer, txn: Txn) -> None:
        rng = self.rng
        offs = {TopicPartition("in", rng.randrange(2)): rng.randrange(1000) for _ in range(rng.randint(1, 2))}
        self.log(f"send_offsets {dict(offs)}")
        try:
            for attempt in range(self.calls()):
                self.maybe_calm(attempt)
                try:
                    await self.guarded("send_offsets", p.send_offsets_to_transaction(offs, "g"))
                    break
                except KafkaTimeoutError as exc:
                    self.log(f"  send_offsets timed out: {exc}")
            else:
                self.problems.append(f"send_offsets never finished after {self.calls()} calls")
                raise Violation("send_offsets")
            txn.offsets.update({(tp.topic, tp.partition): o for tp, o in offs.items()})
        except KafkaError as exc:
            self.log(f"  send_offsets raised {type(exc).__name__}: {exc}")
            txn.offsets_maybe = getattr(txn, "offsets_maybe", {})
            txn.offsets_maybe.update({(tp.topic, tp.partition): o for tp, o in offs.items()})

    async def end(self, p: Producer, txn: Txn) -> bool:
        """Commit or abort; False when the producer cannot go on."""
        rng = self.rng
        commit = rng.random() < 0.7
        if commit:
            for attempt in range(self.calls()):
                self.maybe_calm(attempt)
                cancel = rng.random() < 0.15
                self.log(f"commit (attempt {attempt}{', caller cancels' if cancel else ''})")
                try:
                    if cancel:
                        t = asyncio.ensure_future(p.commit_transaction())
                        await asyncio.sleep(rng.choice([0, 0.001, 0.05, 1.0]))
                        if not t.done():
                            t.cancel()
                            try:
                                await t
                            except asyncio.CancelledError:
                                self.log("  commit cancelled by caller")
                                continue
                        else:
                            await t
                    else:
                        await self.guarded("commit", p.commit_transaction())
                    txn.status = "committed"
                    self.log("  committed")
                    return True
                except KafkaTimeoutError as exc:
                    self.log(f"  commit timed out: {exc}")
                    if "goes on" not in str(exc):
                        self.problems.append(f"commit KafkaTimeoutError without 'goes on': {exc}")
                    continue
                except TransactionAbortableError as exc:
                    self.log(f"  commit abortable: {exc}")
                    break
                except ProducerFatalError as exc:
                    self.log(f"  commit fatal: {exc}")
                    txn.status = "unknown"
                    return False
                except TransactionStateError as exc:
                    self.log(f"  commit state error: {exc}")
                    self.problems.append(f"commit raised TransactionStateError: {exc}")
                    txn.status = "unknown"
                    return False
                except KafkaError as exc:
                    self.log(f"  commit raised {type(exc).__name__}: {exc}")
                    self.problems.append(f"commit raised unexpected {type(exc).__name__}: {exc}")
                    txn.status = "unknown"
                    return False
            else:
                self.problems.append(f"commit never finished after {self.calls()} calls")
                txn.status = "unknown"
                return False
        for attempt in range(self.calls()):
            self.maybe_calm(attempt)
            self.log(f"abort (attempt {attempt})")
            try:
                await self.guarded("abort", p.abort_transaction())
                txn.status = "aborted"
                self.log("  aborted")
                return True
            except KafkaTimeoutError as exc:
                self.log(f"  abort timed out: {exc}")
                continue
            except ProducerFatalError as exc:
                self.log(f"  abort fatal: {exc}")
                txn.status = "unknown-abort"
                return False
            except KafkaError as exc:
                self.log(f"  abort raised {type(exc).__name__}: {exc}")
                self.problems.append(f"abort raised unexpected {type(exc).__name__}: {exc}")
                txn.status = "unknown-abort"
                return False
        self.problems.append(f"abort never finished after {self.calls()} calls")
        txn.status = "unknown-abort"
        return False

    async def workload(self, p: Producer) -> None:
        rng = self.rng
        for i in range(rng.randint(3, 7)):
            txn = Txn(i)
            self.txns.append(txn)
            self.log(f"begin {i}")
            try:
                p.begin_transaction()
            except KafkaError as exc:
                self.log(f"  begin raised {type(exc).__name__}: {exc}")
                txn.status = "never"
                return
            for _ in range(rng.randint(1, 6)):
                if self.faults and rng.random() < self.step_fault:
                    self.fault()
                r = rng.random()
                if r < 0.15 and self.extra:
                    self.log("background send")
                    self.background.append(asyncio.ensure_future(self.one_send(p, txn)))
                elif r < 0.7:
                    await self.one_send(p, txn)
                elif r < 0.8:
                    await self.offsets(p, txn)
                elif r < 0.9:
                    await asyncio.sleep(rng.choice([0.001, 0.05, 0.5]))
                else:
                    self.log("flush")
                    await self.guarded("flush", p.flush())
            if self.faults and rng.random() < self.step_fault:
                self.fault()
            if self.extra and rng.random() < 0.1:
                self.log("leave the transaction open for close()")
                txn.status = "open"
                if self.rng.random() < 0.5:
                    self.log("commit in the background, then close")
                    txn.status = "unknown"
                    bg = asyncio.ensure_future(p.commit_transaction())
                    bg.add_done_callback(lambda t: t.cancelled() or t.exception())
                    self.background.append(bg)
                    await asyncio.sleep(rng.choice([0, 0.01, 0.5]))
                return
            if not await self.end(p, txn):
                return

    async def main(self) -> None:
        loop = asyncio.get_running_loop()
        self.t0 = loop.time()
        c = self.cluster = self.new_cluster(self.Cluster, self.TOPICS)
        self.cluster_built()
        if isinstance(c, HonestCluster):
            c.mangle_rng = random.Random(f"mangles-{self.seed}")
            if self.broken.random() < self.broken_odds:  # the first answers too
                self.brake(first=True)
        rng = self.rng
        if self.options is not None:
            opts = dict(self.options)
        else:
            opts = {
                "linger_ms": rng.choice([0, 0, 5]),
                "retry_backoff_ms": 10,
                "batch_size": rng.choice([16384, 60]),
                "request_timeout_ms": rng.choice([30_000, 1_000]),
                "max_block_ms": rng.choice([60_000, 2_000]),
            }
            opts["delivery_timeout_ms"] = rng.choice([120_000, opts["request_timeout_ms"] + 5])
            if rng.random() < 0.2:
                c.coordinator.transaction_version = 2
            if rng.random() < 0.2:
                c.duplicate_error = True
            if self.extra and rng.random() < 0.5:
                opts["buffer_memory"] = rng.choice([3000, 8000])
        self.log(f"options {opts} tv={c.coordinator.transaction_version} dup_error={c.duplicate_error}")
        self.opts = opts
        p = Producer(bootstrap_servers=c.bootstrap, transactional_id="txn-1", **opts)
        p._partitioner._random = random.Random(self.seed)  # keyless records' partitions repeat
        p._lanes_on = self.seed % 3 == 0  # the compiled lanes read the wall clock: sizes repeat without
        try:
            await self.guarded("start", p.start())
        except KafkaError as exc:
            self.problems.append(f"start failed {exc!r}")
            return
        chaos = asyncio.ensure_future(self.chaos()) if self.faults else None
        try:
            await self.workload(p)
        except Violation:
            pass
        finally:
            if chaos is not None:
                chaos.cancel()
            close_timeout = None
            if self.extra and rng.random() < 0.3:
                close_timeout = rng.choice([0, 0.5, 5.0])
            else:
                self.heal()
            self.log(f"close timeout={close_timeout}")
            with contextlib.suppress(Violation):
                await self.guarded("close", p.close(close_timeout))
            self.heal()
            for task in self.background:
                if not task.done():
                    self.problems.append("HANG: a background send never returned")
                    task.cancel()
        await asyncio.sleep(0.1)
        self.check()

    def cluster_built(self) -> None:
        """The cluster has its brokers and topics; the producer is not made yet."""

    # -- the checks ------------------------------------------------------------------------------

    def incarnations(self) -> list[tuple[str, list, tuple[int, ...]]]:
        """The logs to check: each topic, its partitions, and what tells this incarnation of the
        topic from others of the same name (nothing here: a topic is never deleted)."""
        return [(t, self.cluster.topics[t], ()) for t in self.TOPICS]

    def vanished(self) -> set[bytes]:
        """Records no reader can see whatever their transaction's outcome (nothing here: their
        partition was deleted before the transaction ended)."""
        return set()

    def check(self) -> None:
        c = self.cluster
        gone = self.vanished()
        self.by_value = {r.value: r for txn in self.txns for r in txn.records}
        self.partial_send_many: list = []
        committed: dict[bytes, list[tuple[str, int]]] = {}
        raw: dict[bytes, list[tuple[str, int, int]]] = {}
        for t, parts, _ in self.incarnations():
            for idx, part in enumerate(parts):
                for v in part.committed:
                    committed.setdefault(v, []).append((t, idx))
                for batch in part.log:
                    for j, v in enumerate(batch.values):
                        raw.setdefault(v, []).append((t, idx, batch.base_offset + j))
                # order per partition: a record whose call returned before another's began comes first
                recs = [self.by_value[v] for v in part.committed if v in self.by_value]
                for i, a in enumerate(recs):
                    for b in recs[i + 1 :]:
                        if b.end < a.start or (b.call == a.call and b.index < a.index):
                            self.problems.append(f"ORDER: {t}-{idx} committed {a.value[:12]!r} before {b.value[:12]!r}")
        for v, where in committed.items():
            if len(where) > 1:
                self.problems.append(f"DUPLICATE committed {v!r} at {where}")
        for txn in self.txns:
            acked_in = acked_out = 0
            for rec in txn.records:
                out = self.outcome(rec)
                if rec.queued and out == "pending":
                    self.problems.append(f"HANG: record {rec.value!r} of txn {txn.index} never resolved")
                    continue
                vis = rec.value in committed
                if isinstance(out, tuple):  # RecordMetadata
                    where = raw.get(rec.value, [])
                    duplicate = any(w[:2] == (out.topic, out.partition) for w in where)
                    if out.offset == -1 and c.duplicate_error and duplicate:
                        pass  # DUPLICATE_SEQUENCE_NUMBER carries no offset (as Java: -1)
                    elif (out.topic, out.partition, out.offset) not in where:
                        self.problems.append(
                            f"ACK-LIE: {rec.value!r} acked at {out.topic}-{out.partition}@{out.offset}, log has {where}"
                        )
                elif isinstance(out, BaseException):
                    pp = getattr(out, "possibly_persisted", None)
                    if pp is False and rec.value in raw:
                        self.problems.append(
                            f"ERROR-LIE: {rec.value!r} failed {type(out).__name__}(possibly_persisted=False) "
                            f"but is in the log {raw[rec.value]}: {out}"
                        )
                    if not isinstance(out, KafkaError):
                        self.problems.append(f"record {rec.value!r} failed with non-Kafka {out!r}")
                if rec.value in gone:
                    self.log(f"  {rec.value!r} of txn {txn.index} went with its deleted partition")
                    continue
                if txn.status == "committed":
                    if rec.queued and not isinstance(out, tuple):
                        if isinstance(out, TransactionStateError) and rec.group is not None:
                            fut = rec.group[0]
                            results = fut.exception().results if fut.exception() is not None else []
                            if any(isinstance(r, tuple) for r in results):  # part of the call went in
                                self.partial_send_many.append(rec.value)
                            continue
                        self.problems.append(
                            f"COMMITTED-WITH-FAILED: txn {txn.index} committed but {rec.value!r} failed: {out!r}"
                        )
                    if isinstance(out, tuple) and not vis:
                        self.problems.append(f"LOST: txn {txn.index} committed, acked {rec.value!r} not visible")
                    if not rec.queued and vis:
                        self.problems.append(f"txn {txn.index}: {rec.value!r} whose send raised is visible")
                elif txn.status in ("aborted", "never", "open", "unknown-abort") and vis:
                    self.problems.append(f"VISIBLE-ABORTED: {rec.value!r} of txn {txn.index} ({txn.status})")
                if vis:
                    acked_in += 1
                elif isinstance(out, tuple):
                    acked_out += 1
            if txn.status == "unknown" and acked_in and acked_out:
                self.problems.append(
                    f"PARTIAL: txn {txn.index} (unknown outcome) has {acked_in} visible, {acked_out} acked not"
                )
        if self.partial_send_many:
            self.problems.append(
                f"PARTIAL-SEND-MANY committed: {len(self.partial_send_many)} records of a send_many failed "
                "with TransactionStateError in a committed transaction"
            )
        # offsets
        expected: dict = {}
        maybe: dict = {}
        for txn in self.txns:
            if txn.status == "committed":
                expected.update(txn.offsets)
                expected.update(getattr(txn, "offsets_maybe", {}))  # committed: they went in, or commit failed
            elif txn.status == "unknown":
                maybe.update(txn.offsets)
                maybe.update(getattr(txn, "offsets_maybe", {}))
        got = c.coordinator.committed.get("g", {})
        for tp, off in got.items():
            if expected.get(tp) != off and maybe.get(tp) != off:
                self.problems.append(f"OFFSETS: group g {tp} committed {off}, expected {expected.get(tp)}")
        for tp, off in expected.items():
            if tp not in got and tp not in maybe:
                self.problems.append(f"OFFSETS: group g {tp} expected {off}, not committed")
        for api, times in getattr(c, "asked", {}).items():  # asked again without a backoff
            for i in range(len(times) - INIT_STORM):
                if times[i + INIT_STORM] - times[i] < 0.01:
                    self.problems.append(
                        f"STORM: {INIT_STORM + 1} {api} requests within 10 ms at {times[i] - self.t0:.3f}"
                    )
                    break


def run_seed(seed: int, verbose: bool = False, extra: bool = False, broken: bool = True) -> Run:
    return Run.play(seed, verbose, extra, broken)


def cli(run_class: type[Run], argv: list[str]) -> None:
    """The command line of a harness of ``run_class``: seeds LO HI, -v, -x (the extras)."""
    extra = "-x" in argv
    command_line(
        lambda seed, verbose: run_class.play(seed, verbose, extra),
        lambda run: str([t.status for t in run.txns]),
        argv,
    )


if __name__ == "__main__":
    cli(Run, sys.argv)
