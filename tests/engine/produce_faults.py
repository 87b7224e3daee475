"""Seeded randomized fault harness for the non-transactional producer on the scripted cluster.

Each seed draws the producer's settings (idempotence on or off, acks, in-flight limit, linger,
small batches and buffer memory, compression, delivery timeout, retries), sends records over
several partitions of three brokers (send, send_many, some cancelled part-way, flush) under
random produce faults in virtual time (among them a partition whose validation refuses batches
for the records it names, INVALID_RECORD / INVALID_TIMESTAMP with record_errors: KIP-467),
closes the producer (with a random timeout), then checks: every future resolved; with
idempotence no record is in the log twice and the acknowledged records of a partition are in
the order their sends were made, and so is any record in the log ahead of one (without
idempotence too when one request is in flight); every acknowledged offset holds its record; no
record said not to be written is in the log, nor one whose send() was cancelled; the buffer
memory is all given back and no batch is left; the record metrics agree with the outcomes; a
record the broker named failed with its error and its own message, the others of its batch
with InvalidBatchError, and no other record so. Some seeds draw broken answers too (see BROKEN and
Run.check for what must hold then): the cluster replaced by another behind the same addresses,
produce answers missing, repeating or misnaming a partition, InitProducerId answers without an
id, metadata naming partition ids outside 0..n-1. The suite runs a few seeds
(test_produce_faults.py); for a long hunt:

    PYTHONPATH=. .venv/bin/python tests/engine/produce_faults.py 0 300      (seeds [0, 300))
    PYTHONPATH=. .venv/bin/python tests/engine/produce_faults.py 17 18 -v   (one seed, with its trace)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import sys
from collections import Counter, deque
from dataclasses import dataclass

from aioprod import Producer
from aioprod.errors import BrokerResponseError, InvalidBatchError, KafkaError, KafkaTimeoutError
from aioprod.producer.outcomes import _NOT_WRITTEN
from aioprod.protocol import messages as m
from aioprod.protocol.messages import ProduceResponseBatchIndexError
from aioprod.protocol.records import read_batch
from tests.engine.fault_runs import SeededRun, Violation, break_metadata, command_line, run_in_virtual_time
from tests.fakes.cluster import Appended, Partition, ScriptedCluster, _ProducerState

TOPICS = {"a": [1, 2, 3], "b": [2, 3, 1, 2]}
#: connections_max_idle_ms drawn: idle connections closed under the faults too (as short as 100 ms: mid-run).
IDLE_LIMITS_MS = [540_000, 100, 300, 1_000, 3_000]
#: NOT_LEADER, NOT_ENOUGH_REPLICAS, REQUEST_TIMED_OUT, CORRUPT_MESSAGE (OUT_OF_ORDER_SEQUENCE_NUMBER
#: comes from the partitions' own checks: see HonestCluster).
PRODUCE_ERRORS = [6, 19, 7, 2]
#: Errors a broker may give after it appended the batch (a produce that waited for its replicas).
AFTER_APPEND = [7, 6]
#: What a partition's validation refuses records with, naming them (KIP-467): INVALID_RECORD (a
#: null key on a compacted topic), INVALID_TIMESTAMP (out of message.timestamp.*.max.ms).
RECORD_ERRORS = {
    87: "One or more records have been rejected",
    32: "One or more records have been rejected due to invalid timestamp",
}
#: Wrong answers a broker, a proxy or the network's other end may give (Run.brake): the cluster
#: behind the bootstrap names replaced by another (another cluster id, its own producers holding
#: the ids ours had), a produce answer broken for one partition (MANGLES), InitProducerId answers
#: with no id and no error, metadata naming a partition id outside 0..n-1 (or a broker id -1).
BROKEN = ["swap", "mangle", "mangle", "mangle", "blank_init", "bad_partition", "bad_partition"]
#: How a produce answer is broken for one of its partitions: no result for it, two results for
#: it, its topic's name in another case (no result for the name sent), or a result for a
#: partition not sent (the ones sent are answered as they should be).
MANGLES = ["omit", "repeat", "case", "stray"]
#: Partition ids a broken metadata answer names, outside 0..n-1 whatever n (n + 1 is drawn too).
BAD_PARTITION_IDS = [-1, -7, 1_000_000, 2**31 - 1]
#: InitProducerId requests within 10 ms that make a storm (asked again without a backoff).
INIT_STORM = 10


@dataclass
class Written:
    """A scripted answer: append the batch as usual, then answer ``code``."""

    code: int


@dataclass(frozen=True)
class Rule:
    """A partition's validation refusing the records whose number (the value up to ':') is
    ``residue`` modulo ``modulus``, with ``code``: a topic config (cleanup.policy=compact, a
    timestamp bound) a record breaks or not by its content alone."""

    code: int
    modulus: int
    residue: int

    def refuses(self, value: bytes | None) -> bool:
        return value is not None and int(value.split(b":")[0]) % self.modulus == self.residue


@dataclass
class Refusal:
    """A batch a partition's validation refused whole for the records it names (KIP-467)."""

    code: int
    values: list[bytes | None]
    named: list[int]
    #: The answer went back on its connection (it was not lost, nor an acks=0 request).
    told: bool = False
    #: (topic, partition) of the batch refused.
    where: tuple[str, int] = ("", -1)


def record_message(value: bytes | None) -> str:
    """The broker's message for a record it names: says which record it is (the client must
    give each named record its own)."""
    return f"record #{(value or b'').split(b':')[0].decode()} refused"


@dataclass
class Rec:
    value: bytes
    topic: str
    future: object = None  # RecordFuture
    group: object = None  # (send_many future, index)
    queued: bool = True  # False: the call raised or was cancelled before queuing it
    raised: bool = False  # the call raised a KafkaError for it: an error the metrics may count
    start: int = 0
    end: int = 1 << 60
    call: int = 0
    index: int = 0


class HonestCluster(ScriptedCluster):
    """Scripted answers a real broker would not give are not given. A sequence refusal (45, 59)
    goes only to a batch the partition's own checks refuse too: a broker checks duplicates
    first, and refuses an in-order sequence of a producer it knows for no reason (scripted
    anyway, the producer renumbers the batch while an earlier attempt of it may still land).
    So those codes come from the partition's checks (a batch sent behind one refused with a
    retriable error gets OUT_OF_ORDER). A :class:`Written` answer appends the batch and then
    answers its error code (a produce that waited for its replicas). A partition with a
    :class:`Rule` refuses a batch holding a record the rule refuses whole, naming each such
    record (KIP-467), as Kafka's LogValidator does: after the leader and size checks, before the
    producer's sequence is looked at (a duplicate or a gap), which the refusal leaves as it was.

    Broken answers (Run.brake) are the fake's own doing, never a real broker's checks: a produce
    answer is broken after the request was handled as usual (what it wrote stays written), and
    :meth:`swap` replaces the whole cluster (its topics, logs, producer ids and cluster id) by a
    fresh one behind the same addresses, keeping the replaced logs for the checks. What the
    checks need is kept as answers go back: which cluster's answer (its generation, the number
    of clusters replaced before it) acknowledged each record."""

    on_answer = None
    #: What metadata answers name as the cluster id (each swap gives another).
    cluster_id = "scripted"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        #: (topic id, partition) -> the :class:`Rule` its validation applies.
        self.rules: dict[tuple[object, int], Rule] = {}
        #: Every batch refused by a rule, in order.
        self.refusals: list[Refusal] = []
        self._refusing: dict[int, Refusal] = {}  # id(records) -> its refusal, while answering
        self._answering: dict[int, list[Refusal]] = {}  # id(request) -> the refusals of its answer
        #: The topics of each cluster replaced by a swap, in order (generation g is replaced[g]).
        self.replaced: list[dict[str, list[Partition]]] = []
        #: Records that the replacing clusters' own producers wrote (under ids ours had).
        self.foreign: set[bytes | None] = set()
        #: node -> how its next produce answers are broken, one partition of each (MANGLES).
        self.mangles: dict[int, deque[str]] = {}
        self.mangle_rng = random.Random(0)
        #: (producer id, epoch) answered by the next InitProducerId requests, without an error.
        self.blank_inits: deque[tuple[int, int]] = deque()
        #: node -> (how, topic, partition index, bad id): its metadata names a partition id
        #: outside 0..n-1 ("extra": one more partition; "replace": instead of one) or, "broker",
        #: a broker with id -1.
        self.bad_partitions: dict[int, tuple[str, str, int, int]] = {}
        #: record -> the generations whose delivered answer acknowledged it (named once, no error).
        self.acked_by: dict[bytes | None, set[int]] = {}
        #: When each InitProducerId request came (virtual time).
        self.init_times: list[float] = []
        self._delivering: dict[int, tuple[int, list]] = {}  # id(request) -> (generation, records acknowledged)

    @property
    def generation(self) -> int:
        return len(self.replaced)

    async def handle(self, conn, frame):
        n = len(self.requests)  # the request handle() records, before its first wait
        if not hasattr(conn, "generation"):
            conn.generation = self.generation  # the cluster whose broker process accepted it
        if conn.generation != self.generation:
            return None  # read by a broker process since replaced: it died with it, unanswered
        answer = await super().handle(conn, frame)
        body = self.requests[n].body if n < len(self.requests) else None
        refusals = self._answering.pop(id(body), ())
        for refusal in refusals:
            refusal.told = answer is not None
        delivering = self._delivering.pop(id(body), None)
        if delivering is not None and answer is not None:
            generation, acked = delivering
            for v in acked:
                self.acked_by.setdefault(v, set()).add(generation)
        return answer

    def swap(self, rng: random.Random) -> str:
        """Another cluster behind the same addresses (the brokers' processes replaced: every
        connection cut): topics of the same names and partition counts with new ids and empty
        logs, another cluster id, producer ids from 1000 again. Its own producers took the ids
        the old cluster gave out (ours among them), and wrote: for most partitions, a run of
        batches around the sequence ours would send next, at our epoch mostly (a batch of ours
        with the same sequences would be taken for their duplicate)."""
        old = self.topics
        self.replaced.append(old)
        self.cluster_id = f"scripted-{self.generation}"
        issued = range(1000, next(self._producer_ids))
        self._producer_ids = itertools.count(issued.stop + rng.randint(0, 3))
        self.topics = {}
        planted = 0
        for name, parts in old.items():
            fresh = self.create_topic(name, [p.leader for p in parts])
            for idx, (was, part) in enumerate(zip(parts, fresh, strict=True)):
                for pid in issued:
                    ours = was.producers.get(pid)
                    if rng.random() > (0.9 if ours is not None else 0.3):
                        continue
                    following = (ours.recent[-1][1] + 1) if ours is not None and ours.recent else 0
                    epoch = ours.epoch if ours is not None and rng.random() < 0.8 else rng.choice([0, 1])
                    sequence = max(0, following - rng.randint(0, 4))
                    state = part.producers[pid] = _ProducerState(epoch)
                    for _ in range(5):
                        size = rng.choice([1, 1, 1, 2, 3])
                        values = tuple(
                            b"theirs-%d-%s%d-%d-%d" % (self.generation, name.encode(), idx, pid, sequence + j)
                            for j in range(size)
                        )
                        offset = part.end_offset
                        part.log.append(Appended(0, pid, epoch, sequence, values, offset))
                        state.recent.append((sequence, sequence + size - 1, offset))
                        self.foreign.update(values)
                        sequence += size
                    planted += 1
        for n in self.nodes:
            self.disconnect(n)
        return f"cluster id {self.cluster_id}, ids {issued.start}-{issued.stop - 1} taken, {planted} producer states"

    def _metadata(self, node, request):
        response = super()._metadata(node, request)
        response.cluster_id = self.cluster_id
        break_metadata(response, self.bad_partitions.get(node.node_id))
        return response

    def _init_producer_id(self, request):
        self.init_times.append(self.clock())
        if self.blank_inits:
            producer_id, epoch = self.blank_inits.popleft()
            return m.InitProducerIdResponse(producer_id=producer_id, producer_epoch=epoch)
        return super()._init_producer_id(request)

    def _append(self, node, topic, index, records, txn_id, version):
        # Kafka validates the records (LogValidator) after the leader and size checks and before
        # the producer's sequence (a duplicate or a gap): a refused batch leaves it as it was.
        parts = self.topics.get(topic)
        part = parts[index] if parts is not None and index < len(parts) else None
        if (
            part is not None
            and (rule := self.rules.get((part.topic_id, index))) is not None
            and part.leader == node.node_id
            and (part.max_batch_bytes is None or len(records) <= part.max_batch_bytes)
        ):
            values = [r.value for r in read_batch(records).records]
            named = [i for i, v in enumerate(values) if rule.refuses(v)]
            if named:
                self._refusing[id(records)] = Refusal(rule.code, values, named)
                return rule.code, -1
        return super()._append(node, topic, index, records, txn_id, version)

    def _produce(self, node, request, version):
        script = list(node.script)
        after: dict[int, int] = {}
        count = sum(len(t.partition_data) for t in request.topic_data)
        for i, answer in enumerate(script[:count]):
            if isinstance(answer, Written):
                after[i] = answer.code
                script[i] = 0
            elif answer in (45, 59):
                script[i] = 0
        node.script = deque(script)
        response, hold = super()._produce(node, request, version)
        i = 0
        for t, td in zip(response.responses, request.topic_data, strict=True):
            for part, pd in zip(t.partition_responses, td.partition_data, strict=True):
                if i in after and part.error_code == 0:
                    part.error_code, part.base_offset = after[i], -1
                refusal = self._refusing.pop(id(pd.records), None)
                if refusal is not None:
                    refusal.where = (t.name, part.index)
                    # The batch whole, naming each invalid record with its own message.
                    self.refusals.append(refusal)
                    self._answering.setdefault(id(request), []).append(refusal)
                    if version >= 8:
                        part.error_message = RECORD_ERRORS[refusal.code]
                        part.record_errors = [
                            ProduceResponseBatchIndexError(k, record_message(refusal.values[k])) for k in refusal.named
                        ]
                if self.on_answer is not None:
                    batch = read_batch(pd.records)
                    first = batch.records[0].value[:8] if batch.records else None
                    self.on_answer(
                        f"  node {node.node_id} {t.name}-{part.index} pid={batch.producer_id}/{batch.producer_epoch} "
                        f"seq={batch.base_sequence} n={len(batch.records)} first={first!r} -> code {part.error_code} "
                        f"offset {part.base_offset}{' (written)' if i in after and refusal is None else ''}"
                        f"{f' naming {refusal.named}' if refusal is not None else ''}"
                    )
                i += 1
        sent = {(t.name, p.index): p.records for t in request.topic_data for p in t.partition_data}
        mangles = self.mangles.get(node.node_id)
        if mangles and request.acks != 0:
            how = mangles.popleft()
            where = self._mangle(response, how)
            if self.on_answer is not None:
                self.on_answer(f"  node {node.node_id} answer broken: {how} {where}")
        named = Counter((t.name, part.index) for t in response.responses for part in t.partition_responses)
        # A refusal the answer no longer names (once, by its name) was not told.
        refusals = self._answering.get(id(request))
        if refusals:
            kept = [r for r in refusals if named[r.where] == 1]
            self._answering[id(request)] = kept
        acked = [
            r.value
            for t in response.responses
            for part in t.partition_responses
            if (t.name, part.index) in sent and named[(t.name, part.index)] == 1 and part.error_code in (0, 46)
            for r in read_batch(sent[(t.name, part.index)]).records
        ]
        self._delivering[id(request)] = (self.generation, acked)
        return response, hold

    def _mangle(self, response, how: str) -> tuple[str, int] | None:
        """Break ``response`` for one of its partitions (MANGLES); returns which (None if none)."""
        rng = self.mangle_rng
        entries = [(t, part) for t in response.responses for part in t.partition_responses]
        if not entries:
            return None
        t, part = rng.choice(entries)
        if how == "omit":
            t.partition_responses.remove(part)
        elif how == "repeat":
            code = rng.choice([0, 7, 6])
            base = (part.base_offset + rng.choice([1, 50]) if part.base_offset >= 0 else 0) if code == 0 else -1
            other = m.ProduceResponsePartition(index=part.index, error_code=code, base_offset=base)
            t.partition_responses.insert(rng.choice([0, len(t.partition_responses)]), other)
        elif how == "case":
            t.partition_responses.remove(part)
            response.responses.append(m.ProduceResponseTopic(name=t.name.upper(), partition_responses=[part]))
        else:  # "stray": a partition not sent, as if written (the ones sent are answered right)
            taken = {p.index for p in t.partition_responses}
            index = rng.choice([i for i in (*range(8), 99) if i not in taken])
            t.partition_responses.append(m.ProduceResponsePartition(index=index, error_code=0, base_offset=0))
            return None
        if not t.partition_responses and rng.random() < 0.5:
            response.responses.remove(t)
        return t.name, part.index


class Run(SeededRun):
    """One seed's run under produce faults. The workload, the run and the checks are shared with
    churn_faults.py (a subclass): what differs there are the hooks below and the faults."""

    #: Topic -> the leaders of its partitions at the start.
    TOPICS = TOPICS
    #: The cluster the run sends to.
    Cluster: type[HonestCluster] = HonestCluster
    #: The mean seconds between the chaos task's draws, one drawn a seed.
    CHAOS_MEANS = [0.05, 0.3, 2.0]
    #: The pauses a worker draws between calls.
    PAUSES = [0.001, 0.05, 0.5, 3.0]
    #: Whether sends draw headers.
    HEADERS = True
    #: How likely the cluster answers NOT_LEADER_OR_FOLLOWER with the new leader (KIP-951).
    KIP951 = 0.7
    #: What send() and send_many() may raise that is not a KafkaError (nothing here: a crash).
    REFUSALS: tuple[type[Exception], ...] = ()
    #: The faults the chaos and the workers draw from (one name a chance).
    FAULTS = [
        "produce_err",
        "produce_err",
        "produce_err",
        "written_err",
        "too_large",
        "hold",
        "stall",
        "burst",
        "disconnect",
        "stop",
        "move_leader",
        "move_leader",
        "stale",
        "address",
        "delay",
        "throttle",
        "deaf",
        "black_hole",
    ]
    #: How likely a fault comes with a partition's validation starting to refuse records (KIP-467),
    #: one drawn a seed. Drawn from a stream of their own (``validity``): the seed's other draws
    #: stay as they were, and a seed that draws 0 runs as before (the suite's seeds 0, 4, 37, 45).
    INVALID_ODDS = [0.0, 0.0, 0.2, 0.5]
    #: How likely a fault comes with a broken answer (BROKEN: see :meth:`brake`), one drawn a seed,
    #: from a stream of its own (``broken``) as INVALID_ODDS: a seed that draws 0 runs as before,
    #: and so does any seed played with ``broken=False``.
    BROKEN_ODDS = [0.0, 0.0, 0.1, 0.3]
    #: How many times a seed's cluster may be replaced (swap).
    SWAPS = 2
    #: The broken answers drawn (one name a chance).
    BROKEN_KINDS = BROKEN

    @classmethod
    def play(cls, seed: int, verbose: bool = False, broken: bool = True) -> Run:
        """Run seed ``seed``: a fresh run of this class in virtual time (``broken=False``: without
        broken answers, as the seed ran before they were drawn)."""
        run = cls(seed, verbose)
        if not broken:
            run.broken_odds = 0.0
        run.lanes = run.rng.random() < 0.3  # the compiled lanes read the wall clock: timestamps then are not pinned
        run_in_virtual_time(seed, run.main, run.problems, pin_timestamps=not run.lanes)
        return run

    def __init__(self, seed: int, verbose: bool = False) -> None:
        super().__init__(seed, verbose)
        self.recs: list[Rec] = []
        self.counter = 0
        self.stopped: set[int] = set()
        self.aliases: dict[int, list[tuple[str, int]]] = {}
        self.calm = False
        self.ticks = 0
        self.background: list[asyncio.Future] = []
        self.opts: dict = {}
        self.metrics: dict = {}
        #: What the producer does not promise but a user may want to know (retriable broker
        #: errors out of retries after an attempt that may have been written say nothing of it).
        self.notes: list[str] = []
        self.lanes = False
        #: id(connection) -> its number in the trace.
        self.conns: dict[int, int] = {}
        self.chaos_mean = self.rng.choice(self.CHAOS_MEANS)
        self.step_fault = self.rng.choice([0.1, 0.3, 0.6])
        self.validity = random.Random(f"validity-{seed}")
        self.invalid_odds = self.validity.choice(self.INVALID_ODDS)
        self.broken = random.Random(f"broken-{seed}")
        self.broken_odds = self.broken.choice(self.BROKEN_ODDS)
        #: The broken answers drawn, by kind (what a seed exercised: see -v).
        self.brakes: Counter[str] = Counter()
        #: Batches sent again after an answer that named them not once: (batch, how).
        self.resent: list[tuple[object, str]] = []

    # -- faults --------------------------------------------------------------------------------

    def fault(self) -> None:
        """Draw a fault and a broker, and inflict it (not once the cluster is healed)."""
        if self.calm:
            return
        kind = self.rng.choice(self.FAULTS)
        n = self.rng.choice(self.fault_targets())
        self.inflict(kind, n)

    def invalidate(self) -> None:
        """A partition's validation refuses some records for a while, naming them (KIP-467), maybe
        with batches over a size refused too (the parts of a split batch are validated then)."""
        c, rng = self.cluster, self.validity
        topic = rng.choice(list(c.topics))
        idx = rng.randrange(len(c.topics[topic]))
        part = c.topics[topic][idx]
        modulus = rng.choice([1, 2, 3, 5])
        rule = Rule(rng.choice(list(RECORD_ERRORS)), modulus, rng.randrange(modulus))
        limit = rng.choice([None, 150, 400])
        after = rng.choice([0.05, 1.0, 10.0])
        c.rules[(part.topic_id, idx)] = rule
        if limit is not None:
            part.max_batch_bytes = limit
        self.log(
            f"FAULT {topic}-{idx} refuses records #{rule.residue} mod {modulus} with {rule.code}"
            f"{f' and batches over {limit} bytes' if limit else ''} for {after}s"
        )
        asyncio.get_running_loop().call_later(after, self._validate_again, part, idx, rule, limit)

    def fault_targets(self) -> list[int]:
        """The brokers a fault may hit."""
        return list(self.cluster.nodes)

    def brake(self, kind: str | None = None) -> None:
        """A wrong answer, or answers, of one kind (BROKEN), drawn from the ``broken`` stream."""
        c, rng = self.cluster, self.broken
        kind = kind or rng.choice(self.BROKEN_KINDS)
        n = rng.choice(list(c.nodes))
        if kind == "swap":
            if c.generation >= self.SWAPS:
                return
            self.log(f"FAULT the cluster is replaced by another: {c.swap(rng)}")
        elif kind == "mangle":
            how, times = rng.choice(MANGLES), rng.choice([1, 1, 3])
            c.mangles.setdefault(n, deque()).extend([how] * times)
            self.log(f"FAULT node {n}'s next {times} produce answer(s) broken: {how}")
        elif kind == "blank_init":
            # The id the cluster would give next, with no epoch, is a blank too.
            blank = rng.choice([(-1, -1), (-1, 0), (1000 + 10 * c.generation, -1)])
            times = rng.choice([1, 3, 30])
            c.blank_inits.extend([blank] * times)
            self.log(f"FAULT the next {times} InitProducerId answers are {blank} without an error")
        else:  # "bad_partition"
            topic = rng.choice(list(self.TOPICS))
            how = rng.choice(["extra", "extra", "replace", "broker"])
            bad = rng.choice([None, *BAD_PARTITION_IDS])
            index = rng.randrange(len(self.TOPICS[topic]))
            after = rng.choice([0.5, 5.0, 30.0])
            c.bad_partitions[n] = spec = (how, topic, index, bad)
            self.log(f"FAULT node {n}'s metadata is broken for {after}s: {spec}")
            asyncio.get_running_loop().call_later(after, self._mend_metadata, n, spec)
        self.brakes[kind] += 1

    def _mend_metadata(self, n: int, spec: tuple) -> None:
        if self.cluster.bad_partitions.get(n) == spec:
            del self.cluster.bad_partitions[n]

    def inflict(self, kind: str, n: int) -> None:
        if self.validity.random() < self.invalid_odds:
            self.invalidate()
        if self.broken.random() < self.broken_odds:
            self.brake()
        c, rng = self.cluster, self.rng
        loop = asyncio.get_running_loop()
        nodes = list(c.nodes)
        node = c.nodes[n]
        if kind == "produce_err":
            code = rng.choice(PRODUCE_ERRORS)
            node.script.append(code)
            self.log(f"FAULT node {n} next produce partition answers {code}")
        elif kind == "written_err":
            code = rng.choice(AFTER_APPEND)
            node.script.append(Written(code))
            self.log(f"FAULT node {n} next produce partition is written, then answered {code}")
        elif kind == "too_large":
            topic = rng.choice(list(TOPICS))
            idx = rng.randrange(len(TOPICS[topic]))
            limit = rng.choice([150, 400, 1200])
            c.topics[topic][idx].max_batch_bytes = limit
            after = rng.choice([0.05, 1.0, 10.0])
            self.log(f"FAULT {topic}-{idx} refuses batches over {limit} bytes for {after}s")
            loop.call_later(after, self._unlimit, topic, idx)
        elif kind in ("hold", "stall"):
            setattr(node, "holding" if kind == "hold" else "stalling", True)
            after = rng.choice([0.01, 0.2, 2.0, 40.0])
            self.log(f"FAULT node {n} {kind}s produce for {after}s")
            loop.call_later(after, self._release, n)
        elif kind == "burst":
            # Pipelined requests met by refusals before the append and writes with errors, maybe
            # with the connection lost after them (a broker without state for the producer then
            # takes a later sequence while an earlier one was refused: KIP-360).
            node.stalling = True
            after = rng.choice([0.02, 0.1, 0.3])
            script = [rng.choice([19, 19, Written(7), Written(6), 0]) for _ in range(rng.randint(1, 5))]
            lost = rng.random() < 0.5
            self.log(f"FAULT node {n} stalls {after}s, then answers {script}{' and drops' if lost else ''}")
            loop.call_later(after, self._burst, n, script, lost)
        elif kind == "disconnect":
            self.log(f"FAULT disconnect node {n}")
            c.disconnect(n)
        elif kind == "stop":
            if n in self.stopped:
                return
            after = rng.choice([0.05, 1.0, 10.0])
            self.log(f"FAULT stop node {n} for {after}s")
            self.stopped.add(n)
            for host, port in [node.address, *self.aliases.get(n, [])]:
                c.network.stop_listening(host, port)
            c.disconnect(n)
            loop.call_later(after, self._start, n)
        elif kind == "move_leader":
            topic = rng.choice(list(TOPICS))
            idx = rng.randrange(len(TOPICS[topic]))
            self.log(f"FAULT leader of {topic}-{idx} -> {n}")
            c.move_leader(topic, idx, n)
        elif kind == "stale":
            topic = rng.choice(list(TOPICS))
            idx = rng.randrange(len(TOPICS[topic]))
            part = c.topics[topic][idx]
            old = rng.choice([m for m in nodes if m != part.leader])
            node.stale[(topic, idx)] = (old, max(0, part.epoch - 1))
            after = rng.choice([0.5, 5.0])
            self.log(f"FAULT node {n} says {topic}-{idx} is led by {old} for {after}s")
            loop.call_later(after, lambda: node.stale.pop((topic, idx), None))
        elif kind == "address":
            new = f"broker{n}-{len(self.aliases.get(n, [])) + 1}.example"
            self.log(f"FAULT node {n} now advertised as {new}")
            if n not in self.stopped:
                c.network.listen(new, node.port, node)
            self.aliases.setdefault(n, []).append(node.address)
            node.host = new
        elif kind == "delay":
            d = rng.choice([0.05, 0.5, 5.0])  # past a 1 s request timeout: the client gives the connection up
            node.delay = d
            self.log(f"FAULT node {n} delays produce answers {d}s")
            loop.call_later(rng.choice([0.5, 3.0]), self._undelay, n)

        elif kind == "throttle":
            node.throttle_ms = rng.choice([10, 300, 2000])
            self.log(f"FAULT node {n} throttles {node.throttle_ms} ms")
            loop.call_later(rng.choice([0.5, 3.0]), setattr, node, "throttle_ms", 0)
        elif kind == "deaf":
            after = rng.choice([0.1, 2.0, 20.0])
            self.log(f"FAULT node {n} stops reading its connections for {after}s")
            node.stop_reading()
            loop.call_later(after, self._hear, n)
        elif kind == "black_hole":
            address = node.address
            after = rng.choice([0.5, 5.0, 20.0])
            self.log(f"FAULT connecting to node {n} at {address} hangs for {after}s")
            c.network.black_holes.add(address)
            loop.call_later(after, c.network.black_holes.discard, address)

    def _hear(self, n: int) -> None:
        for conn in self.cluster.nodes[n].connections:
            conn.side.reading = True

    def _validate_again(self, part: Partition, idx: int, rule: Rule, limit: int | None) -> None:
        rules = self.cluster.rules
        if rules.get((part.topic_id, idx)) is rule:
            del rules[(part.topic_id, idx)]
        if limit is not None and part.max_batch_bytes == limit:
            part.max_batch_bytes = None

    def _unlimit(self, topic: str, idx: int) -> None:
        self.cluster.topics[topic][idx].max_batch_bytes = None

    def _release(self, n: int) -> None:
        self.cluster.nodes[n].release()

    def _burst(self, n: int, script: list[int | Written], lost: bool) -> None:
        node = self.cluster.nodes[n]
        node.script.extend(script)
        node.release()
        if lost:
            asyncio.get_running_loop().call_later(0.001, self.cluster.disconnect, n)

    def _undelay(self, n: int) -> None:
        self.cluster.nodes[n].delay = 0.0

    def _start(self, n: int) -> None:
        if n not in self.stopped:
            return
        self.log(f"start node {n}")
        self.stopped.discard(n)
        node = self.cluster.nodes[n]
        for host, port in [node.address, *self.aliases.get(n, [])]:
            self.cluster.network.listen(host, port, node)

    async def chaos(self) -> None:
        while True:
            await asyncio.sleep(self.rng.expovariate(1 / self.chaos_mean))
            if self.rng.random() < 0.5:
                self.fault()

    def heal(self) -> None:
        c = self.cluster
        self.calm = True
        for n, node in c.nodes.items():
            node.script.clear()
            node.stale.clear()
            node.release()
            node.delay = 0.0
            node.throttle_ms = 0
            self._hear(n)
            self._start(n)
        c.network.black_holes.clear()
        c.rules.clear()
        c.mangles.clear()
        c.blank_inits.clear()
        c.bad_partitions.clear()
        for parts in c.topics.values():
            for part in parts:
                part.max_batch_bytes = None

    # -- the workload --------------------------------------------------------------------------

    def value(self) -> bytes:
        self.counter += 1
        r = self.rng.random()
        pad = b"" if r < 0.6 else b":" + b"x" * self.rng.choice([40, 300, 1500])
        return b"%d" % self.counter + pad

    def count(self, topic: str) -> int:
        """How many partitions the workload takes ``topic`` to have."""
        return len(self.TOPICS[topic])

    def refused(self, topic: str, part: int | None, exc: Exception) -> None:
        """A send or send_many raised one of REFUSALS."""

    async def one_send(self, p: Producer) -> None:
        rng = self.rng
        topic = rng.choice(list(self.TOPICS))
        v = self.value()
        key = rng.choice([None, None, b"k1", b"k2", b"k3"])
        part = rng.choice([None, None, rng.randrange(self.count(topic))])
        headers = [("h", b"x"), ("n", None)] if self.HEADERS and rng.random() < 0.2 else None
        rec = Rec(v, topic)
        self.ticks += 1
        rec.start = rec.call = self.ticks
        self.recs.append(rec)
        cancel = rng.choice([None] * 9 + [0.0, 0.01, 0.3])
        shown = f" headers={bool(headers)}" if self.HEADERS else ""
        self.log(f"send {topic} {v[:12]!r} key={key} partition={part}{shown} cancel={cancel}")
        call = p.send(topic, v, key=key, partition=part, headers=headers)
        try:
            if cancel is None:
                rec.future = await self.guarded("send", call)
            else:
                rec.future = await asyncio.wait_for(call, cancel)
            self.ticks += 1
            rec.end = self.ticks
        except KafkaError as exc:
            rec.queued, rec.raised = False, True
            self.log(f"  send raised {type(exc).__name__}: {exc}")
        except self.REFUSALS as exc:
            rec.queued = False
            self.refused(topic, part, exc)
        except TimeoutError:
            rec.queued = False
            self.log("  send cancelled by wait_for")

    async def one_send_many(self, p: Producer) -> None:
        rng = self.rng
        topic = rng.choice(list(self.TOPICS))
        n = rng.randint(1, 12)
        vals = [self.value() for _ in range(n)]
        keys = [rng.choice([b"k1", b"k2", b"k3", None]) for _ in range(n)] if rng.random() < 0.3 else None
        part = rng.randrange(self.count(topic)) if keys is None and rng.random() < 0.5 else None
        draw = self.HEADERS and rng.random() < 0.2
        headers = [[("h", b"%d" % i)] if i % 2 else None for i in range(n)] if draw else None
        recs = [Rec(v, topic) for v in vals]
        self.ticks += 1
        for i, r in enumerate(recs):
            r.start = r.call = self.ticks
            r.index = i
        self.recs.extend(recs)
        cancel = rng.choice([None] * 6 + [0.0, 0.001, 0.05, 0.5])
        self.log(f"send_many {topic} {len(vals)} records keys={keys is not None} partition={part} cancel={cancel}")
        call = p.send_many(topic, vals, keys=keys, partition=part, headers=headers)
        try:
            if cancel is None:
                fut = await self.guarded("send_many", call)
            else:
                fut = await asyncio.wait_for(call, cancel)
        except KafkaError as exc:
            for r in recs:
                r.queued, r.raised = False, True
            self.log(f"  send_many raised {type(exc).__name__}: {exc}")
            return
        except self.REFUSALS as exc:
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
                await asyncio.sleep(rng.choice(self.PAUSES))
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
            "max_in_flight_requests_per_connection": rng.choice([1, 5]),
            "linger_ms": rng.choice([0, 5, 50]),
            "batch_size": rng.choice([200, 1000, 16384]),
            "buffer_memory": rng.choice([4000, 12000, 32 * 1024 * 1024]),
            "compression_type": rng.choice(["none", "none", "gzip", "lz4"]),
            "request_timeout_ms": rng.choice([30_000, 1_000]),
            "retry_backoff_ms": rng.choice([10, 100]),
            "max_block_ms": rng.choice([60_000, 2_000, 200]),
            "metadata_max_age_ms": rng.choice([300_000, 1_000]),
        }
        opts["connections_max_idle_ms"] = self.later_rng.choice(IDLE_LIMITS_MS)
        opts["delivery_timeout_ms"] = rng.choice(
            [120_000, opts["request_timeout_ms"] + opts["linger_ms"] + rng.choice([5, 2000])]
        )
        retries = rng.choice([None, 3, 0])
        if retries is not None and not (idem and retries == 0):
            opts["retries"] = retries
        return opts

    async def main(self) -> None:
        loop = asyncio.get_running_loop()
        self.t0 = loop.time()
        c = self.cluster = self.new_cluster(self.Cluster, self.TOPICS)
        c.on_answer = self.log if self.verbose else None
        c.mangle_rng = random.Random(f"mangles-{self.seed}")
        self.cluster_built()
        if self.broken.random() < self.broken_odds:
            self.brake("blank_init")  # the first InitProducerId answers too
        rng = self.rng
        opts = self.opts = self.options()
        c.duplicate_error = rng.random() < 0.25
        c.kip951 = rng.random() < self.KIP951
        c.accepts_unknown_producers = rng.random() < 0.5
        self.log(
            f"options {opts} dup_error={c.duplicate_error} kip951={c.kip951} "
            f"accepts_unknown_producers={c.accepts_unknown_producers} lanes={self.lanes}"
        )
        p = self.producer = Producer(bootstrap_servers=c.bootstrap, **opts)
        p._partitioner._random = random.Random(self.seed)  # keyless records' partitions repeat
        if not self.lanes:
            p._lanes_on = False  # record timestamps follow the virtual clock: sizes repeat
        try:
            await self.guarded("start", p.start())
        except KafkaError as exc:
            self.problems.append(f"start failed {exc!r}")
            return
        self.watch_sender(p)
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
        await asyncio.sleep(2.0)  # held and delayed answers land; nothing more is written
        self.check()

    def cluster_built(self) -> None:
        """The cluster has its brokers and topics; the producer is not made yet."""

    def connection(self, conn) -> str:
        """How the trace names a connection: its number in this run and its host."""
        number = self.conns.setdefault(id(conn), len(self.conns))
        return f"conn#{number} {conn.host}"

    def watch_sender(self, p: Producer) -> None:
        """Note each batch sent again after an answer that named it not once (``resent``)."""
        sender = p._sender
        send, on_response = sender._send, sender._on_response
        broken: dict[object, str] = {}  # batch -> what its answer did

        def watched_send(conn, batches, cluster, now):
            self.resent.extend((batch, broken[batch]) for batch in batches if batch in broken)
            send(conn, batches, cluster, now)

        def watched_on_response(batches, answer, node, sent_at):
            if isinstance(answer, m.ProduceResponse):
                named = Counter((t.name, part.index) for t in answer.responses for part in t.partition_responses)
                for batch in batches:
                    count = named[(batch.tp.topic, batch.tp.partition)]
                    if count != 1:
                        broken[batch] = f"naming it {count} times"
            on_response(batches, answer, node, sent_at)

        sender._send = watched_send
        sender._on_response = watched_on_response

    def trace_sender(self, p: Producer) -> None:
        """Log each produce request the sender writes and what came of it (instance attributes
        in front of the methods: nothing outlives this producer)."""
        sender = p._sender
        send, on_response = sender._send, sender._on_response

        def describe(batches) -> str:
            return ", ".join(
                f"{b.tp.topic}-{b.tp.partition}:{b.producer_id}/{b.producer_epoch}/{b.base_sequence}x{b.record_count}"
                for b in batches
            )

        def traced_send(conn, batches, cluster, now):
            send(conn, batches, cluster, now)
            self.log(f"> node {conn.node_id} {self.connection(conn)}: {describe(batches)}")

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
        self.check_emptied(p._accumulator)

    def incarnations(self) -> list[tuple[str, list, tuple[int, ...]]]:
        """The logs to check: each topic, its partitions, and what tells this incarnation of the
        topic from others of the same name: the generation of its cluster (a topic is never
        deleted here, but a swap replaces the cluster, its logs kept in ``replaced``)."""
        c = self.cluster
        return [(t, topics[t], (g,)) for g, topics in enumerate([*c.replaced, c.topics]) for t in self.TOPICS]

    def generation_of(self, where: tuple) -> int:
        """The generation of the cluster whose log ``where`` (topic, partition, offset,
        *incarnation) is in."""
        return where[3]

    def check(self) -> None:
        """What must hold, exactly. A cluster replaced (swap) takes its logs with it: a record
        acknowledged by it and in its log at the offset acknowledged was delivered, and is not
        lost for being in no later cluster's log (nor is a record in two clusters' logs written
        twice: a retry into the new cluster of what the old one wrote, its answer lost, is no
        duplicate). But an acknowledgement counts only from the cluster that gave it: a record
        acknowledged must be, at the offset acknowledged, in the log of a cluster whose answer,
        delivered, acknowledged it (named it once, without an error), or it is lost (taken by the
        new cluster for another producer's duplicate). An error saying a record is not in the log is
        a lie if it is in any cluster's log, a replaced one's too (the producer cannot tell that
        cluster is gone: a failover may leave it serving readers). Every other check holds in
        each cluster's logs as before; another producer's records (``foreign``) are nobody's
        here. Without idempotence, a batch is not sent again after an answer with no result for
        it or two (its topic misnamed too): it may have been written, and is failed (the
        sender's own view, ``resent``: an earlier attempt the broker reads late may still land
        after it). Every acknowledgement comes from an answer that went back and acknowledged
        the record (ACK-UNANSWERED), swap or not; InitProducerId is not asked again and again
        without a backoff (INIT-STORM)."""
        c, opts = self.cluster, self.opts
        idem = opts["enable_idempotence"]
        acks0 = opts["acks"] == 0
        ordered = idem or (opts["max_in_flight_requests_per_connection"] == 1 and not acks0)
        by_value = {r.value: r for r in self.recs}
        #: value -> [(topic, partition, offset, *incarnation)]
        raw: dict[bytes, list[tuple]] = {}
        log_count = 0
        for t, parts, incarnation in self.incarnations():
            for idx, part in enumerate(parts):
                for batch in part.log:
                    for j, v in enumerate(batch.values):
                        if v in c.foreign:
                            continue
                        raw.setdefault(v, []).append((t, idx, batch.base_offset + j, *incarnation))
                        log_count += 1
        if idem:
            for v, where in raw.items():
                if len(where) > 1:
                    # A copy in a deleted topic is gone with it: written again into the topic
                    # created since (a retry of an attempt whose answer never came) is no duplicate.
                    same = len({w[3:] for w in where}) < len(where)
                    (self.problems if same else self.notes).append(
                        f"DUPLICATE: {v[:12]!r} written {len(where)} times: {where}"
                    )
        for v in raw:
            if v not in by_value:
                self.problems.append(f"UNKNOWN record {v[:12]!r} in the log")
        #: (topic, partition, *incarnation) -> [(offset, acknowledged record)]
        acked: dict[tuple, list[tuple[int, Rec]]] = {}
        failed_queued = 0
        failed_unqueued = 0  # refused by send()/send_many(): counted if the producer saw why
        acked_count = 0
        for rec in self.recs:
            out = self.outcome(rec)
            where = raw.get(rec.value, [])
            failed_unqueued += rec.raised
            if not rec.queued:
                if where:
                    self.problems.append(
                        f"NOT-QUEUED-WRITTEN: {rec.value[:12]!r} (its call raised) is in the log {where}"
                    )
                continue
            if out == "pending":
                continue  # reported by check_closed
            if isinstance(out, tuple):  # RecordMetadata
                acked_count += 1
                if acks0:
                    continue
                answered = c.acked_by.get(rec.value, set())
                if not answered:
                    self.problems.append(
                        f"ACK-UNANSWERED: {rec.value[:12]!r} acked at {out.topic}-{out.partition}@{out.offset}, but no "
                        f"answer that went back acknowledged it; log has {where}"
                    )
                    continue
                mine = [w for w in where if w[:2] == (out.topic, out.partition) and self.generation_of(w) in answered]
                at = [w for w in mine if w[2] == out.offset]
                if out.offset == -1 and c.duplicate_error and mine:
                    w = mine[0]  # DUPLICATE_SEQUENCE_NUMBER carries no offset (as Java: -1)
                elif not at:
                    self.problems.append(
                        f"ACK-LIE: {rec.value[:12]!r} acked at {out.topic}-{out.partition}@{out.offset}, "
                        f"log has {where}{f' (acknowledged by cluster(s) {sorted(answered)})' if c.replaced else ''}"
                    )
                    continue
                else:
                    w = at[0]
                acked.setdefault(w[:2] + w[3:], []).append((w[2], rec))
            elif isinstance(out, BaseException):
                if _queued(out):
                    failed_queued += 1
                else:
                    failed_unqueued += 1
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
            self.check_order(acked, raw, by_value)
        self.check_refusals()
        if not idem:
            for batch, what in self.resent:
                self.problems.append(
                    f"RESENT: {batch.tp.topic}-{batch.tp.partition} ({batch.record_count} record(s)) sent again after "
                    f"an answer {what} (without idempotence: it may have been written)"
                )
        times = c.init_times
        for i in range(len(times) - INIT_STORM):
            if times[i + INIT_STORM] - times[i] < 0.01:
                self.problems.append(
                    f"INIT-STORM: {INIT_STORM + 1} InitProducerId requests within 10 ms at {times[i] - self.t0:.3f}"
                )
                break
        m = self.metrics
        if not failed_queued <= m["record-error-total"] <= failed_queued + failed_unqueued:
            self.problems.append(
                f"METRICS: record-error-total {m['record-error-total']} but {failed_queued} failed "
                f"and {failed_unqueued} were refused by their call"
            )
        if not acks0 and m["record-send-total"] < log_count:
            self.problems.append(f"METRICS: record-send-total {m['record-send-total']} < {log_count} records written")
        if not acks0 and m["record-send-total"] < acked_count:
            self.problems.append(f"METRICS: record-send-total {m['record-send-total']} < {acked_count} acknowledged")

    def check_refusals(self) -> None:
        """The records of batches refused for records the broker named (KIP-467): a named record
        failed with the broker's error and its own message; the others of such a batch with
        InvalidBatchError (its cause the broker's error; not written unless an earlier attempt
        may have been: the checks above); no record failed so unless a broker refused it so; and a
        refusal whose answer went back is what its records end with (unless they ended before)."""
        acks0 = self.opts["acks"] == 0
        named: dict[bytes | None, set[int]] = {}  # value -> the codes it was named with
        spared: dict[bytes | None, set[int]] = {}  # value -> the codes of refusals of its batch, it not named
        told: dict[bytes | None, tuple[int, bool]] = {}  # value -> (code, named) of the last refusal answered
        for refusal in self.cluster.refusals:
            for i, v in enumerate(refusal.values):
                (named if i in refusal.named else spared).setdefault(v, set()).add(refusal.code)
                if refusal.told:
                    told[v] = (refusal.code, i in refusal.named)
        for rec in self.recs:
            out = self.outcome(rec)
            if not rec.queued or out == "pending":
                continue
            v = rec.value
            code = out.code if isinstance(out, BrokerResponseError) else None
            if code in RECORD_ERRORS:
                if code not in named.get(v, ()):
                    self.problems.append(
                        f"INVALID-LIE: {v[:12]!r} failed {type(out).__name__} but no broker named it with {code} "
                        f"(named with {named.get(v)}, its batch refused with {spared.get(v)})"
                    )
                elif record_message(v) not in str(out):
                    self.problems.append(f"INVALID-MESSAGE: {v[:12]!r} failed without its own message: {out}")
            elif isinstance(out, InvalidBatchError):
                cause = getattr(out.__cause__, "code", None)
                if cause not in spared.get(v, ()):
                    self.problems.append(
                        f"INVALID-BATCH-LIE: {v[:12]!r} failed InvalidBatchError (cause {out.__cause__!r}) but no "
                        f"batch of it was refused so, it not named (named with {named.get(v)}, its batch refused "
                        f"with {spared.get(v)})"
                    )
            if v not in told or acks0:
                continue
            told_code, was_named = told[v]
            if isinstance(out, tuple):
                self.problems.append(
                    f"REFUSAL-IGNORED: {v[:12]!r} acknowledged at {out.topic}-{out.partition}@{out.offset}, but its "
                    f"batch was refused with {told_code}{' naming it' if was_named else ''}"
                )
            elif (code == told_code) if was_named else isinstance(out, InvalidBatchError):
                continue
            elif code in RECORD_ERRORS or isinstance(out, InvalidBatchError):
                self.problems.append(
                    f"REFUSAL-MISREAD: {v[:12]!r} failed {type(out).__name__} ({out}), but its batch was refused "
                    f"with {told_code}{' naming it' if was_named else ', not naming it'}"
                )
            else:
                self.notes.append(f"REFUSAL-OVERTAKEN: {v[:12]!r} refused with {told_code}, failed {out!r}")

    def check_order(
        self, acked: dict[tuple, list[tuple[int, Rec]]], raw: dict[bytes, list[tuple]], by_value: dict[bytes, Rec]
    ) -> None:
        """The records the order promise covers are in the log in the order of their sends."""
        # With idempotence every record in the log counts; without, only acknowledged ones at
        # their acknowledged offsets (a retry may write a record again, after later ones).
        idem = self.opts["enable_idempotence"]
        logged: dict[tuple, list[tuple[int, Rec]]] = {} if idem else acked
        for v, where in raw.items() if idem else ():
            if v in by_value:
                for t, idx, offset, *incarnation in where:
                    logged.setdefault((t, idx, *incarnation), []).append((offset, by_value[v]))
        for tp, items in acked.items():
            earlier = sorted(logged.get(tp, []), key=lambda x: x[0])
            for pb, b in items:
                for pa, a in earlier:
                    if pa >= pb:
                        break
                    # a (acknowledged or not) is before the acknowledged b in the log: wrong if
                    # b's call returned before a's began
                    if b.end < a.start or (b.call == a.call and b.index < a.index):
                        self.problems.append(
                            f"ORDER: {tp[0]}-{tp[1]} has {a.value[:12]!r}@{pa} ({type(self.outcome(a)).__name__}) "
                            f"before the acknowledged {b.value[:12]!r}@{pb}, sent earlier"
                        )


def _queued(error: BaseException) -> bool:
    """False for the error of a send_many's records that the call could not queue (the buffer
    stayed full, or the producer closed or failed meanwhile): they were never in a batch."""
    text = str(error)
    return not any(
        s in text for s in ("stayed full for max_block_ms", "accepts no more records", "no more records are")
    )


def run_seed(seed: int, verbose: bool = False, broken: bool = True) -> Run:
    return Run.play(seed, verbose, broken)


if __name__ == "__main__":
    command_line(run_seed, lambda run: f"{len(run.recs)} records {run.opts} broken={dict(run.brakes)}", sys.argv)
