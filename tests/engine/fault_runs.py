"""What the seeded fault harnesses (txn_faults.py, produce_faults.py, churn_faults.py,
concurrent_api.py) share: one seed's run in virtual time, its cluster, the check that close()
left nothing behind, the suite's test of a seed, and their command line. (churn_faults.py
shares more with produce_faults.py: its workload, run and checks, as a subclass of its Run.)"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aioprod.errors import KafkaError, SendManyError
from aioprod.producer.accumulator import RecordAccumulator
from aioprod.protocol import messages as m
from tests.fakes.clock import VirtualClock
from tests.fakes.cluster import ScriptedCluster
from tests.fakes.network import MemoryNetwork

HANG = 900.0  # virtual seconds: far beyond every bound the producer has


class Violation(Exception):
    """A promise broken on the way (a call that hangs): the run's problems say which."""


class SeededRun:
    """One seed's run: its random draws, its trace and the problems it found."""

    def __init__(self, seed: int, verbose: bool) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        #: Draws added after a harness's seeds were first run, apart from ``rng`` so that those
        #: seeds still draw what they drew (a seed's trace stays comparable across versions).
        self.later_rng = random.Random(f"later-{seed}")
        self.verbose = verbose
        self.trace: list[str] = []
        self.problems: list[str] = []
        self.t0 = 0.0

    def new_cluster(self, cls: type[ScriptedCluster], topics: dict[str, list[int]]) -> Any:
        """Three brokers of ``cls`` on an in-memory network that asyncio.open_connection reaches
        (run_in_virtual_time puts it back), with ``topics`` (name: each partition's leader)."""
        network = MemoryNetwork()
        asyncio.open_connection = network.open_connection  # type: ignore[assignment]
        cluster = cls(network, nodes=3)
        for topic, leaders in topics.items():
            cluster.create_topic(topic, leaders=leaders)
        return cluster

    def check_emptied(self, acc: RecordAccumulator) -> None:
        """After close(): the buffer memory all given back, no batch or queue left."""
        if acc.pool.used != 0:
            self.problems.append(f"MEMORY: {acc.pool.used} bytes of buffer_memory still reserved after close()")
        if acc.pool.waiting:
            self.problems.append(f"MEMORY: {acc.pool.waiting} reservations still waiting after close()")
        if acc.incomplete or acc.open_batches:
            self.problems.append(
                f"LEFTOVER: {len(acc.incomplete)} incomplete batches, {len(acc.open_batches)} queues after close()"
            )

    def log(self, msg: str) -> None:
        line = f"[{asyncio.get_running_loop().time() - self.t0:9.3f}] {msg}"
        self.trace.append(line)
        if self.verbose:
            print(line)

    async def guarded(self, what: str, aw: Awaitable[Any]) -> Any:
        """``aw``, or a HANG problem (and :class:`Violation`) if it has not returned in HANG s."""
        try:
            async with asyncio.timeout(HANG):
                return await aw
        except TimeoutError as exc:
            if isinstance(exc, KafkaError):
                raise
            self.problems.append(f"HANG: {what} did not return within {HANG} virtual seconds")
            raise Violation(what) from None

    @staticmethod
    def outcome(rec: Any) -> Any:
        """A record's outcome: its metadata, its error, "pending", or None (never sent): from
        its own future (``rec.future``), or its place in a send_many group (``rec.group``)."""
        if rec.future is not None:
            future = rec.future
            if not future.done():
                return "pending"
            error = future.exception()
            return error if error is not None else future.result()
        if rec.group is not None:
            group, index = rec.group
            if not group.done():
                return "pending"
            error = group.exception()
            if error is None:
                return group.result()[index]
            if isinstance(error, SendManyError):
                return error.results[index]
            return error
        return None


def run_in_virtual_time(
    seed: int, main: Callable[[], Awaitable[None]], problems: list[str], *, pin_timestamps: bool = True
) -> None:
    """Run ``main`` on a fresh loop in virtual time from 1000 s, with ``random`` seeded with
    ``seed``; a crash is added to ``problems``. Everything patched is put back: the random
    state, record timestamps, ``asyncio.open_connection`` (the scripted cluster's network)."""
    saved = asyncio.open_connection

    async def go() -> None:
        import aioprod.producer.producer as producer_module

        clock = VirtualClock(asyncio.get_running_loop())
        clock.now = 1000.0  # every run starts at the same virtual time ...
        clock.install()
        # ... and record timestamps follow it (wall-clock deltas change record sizes); the
        # compiled send lanes read the wall clock themselves.
        now_ms = producer_module._now_ms
        if pin_timestamps:
            producer_module._now_ms = lambda: 1_700_000_000_000 + int(clock.now * 1000)
        state = random.getstate()
        random.seed(seed)
        try:
            await main()
        finally:
            random.setstate(state)
            producer_module._now_ms = now_ms
            clock.uninstall()

    try:
        asyncio.run(go())
    except Exception as exc:
        problems.append(f"CRASH: {exc!r}\n{traceback.format_exc()}")
    finally:
        asyncio.open_connection = saved


class _ErrorCatcher(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.getMessage())


def check_seed(run_seed: Callable[[int], SeededRun], seed: int) -> None:
    """The suite's test of one seed: no problems, and nothing of the run outlives it (the random
    state, TCP, the record clock are the suite's again)."""
    import aioprod.producer.producer as producer_module

    state, connect, now_ms = random.getstate(), asyncio.open_connection, producer_module._now_ms
    run = run_seed(seed)
    assert not run.problems, "\n".join(run.problems + run.trace[-40:])
    assert random.getstate() == state, "the random state is not put back"
    assert asyncio.open_connection is connect, "asyncio.open_connection is not put back"
    assert producer_module._now_ms is now_ms, "the record clock is not put back"


def command_line(run_seed: Callable[[int, bool], Any], describe: Callable[[Any], str], argv: Sequence[str]) -> None:
    """``LO HI [-v]``: run seeds [LO, HI) and print the problems of each (and any ERROR logged)."""
    lo, hi = int(argv[1]), int(argv[2])
    verbose = "-v" in argv
    catcher = _ErrorCatcher()
    logging.getLogger("aioprod").addHandler(catcher)
    logging.getLogger("aioprod").addHandler(logging.NullHandler())  # retries warn by design: not on stderr
    logging.getLogger("asyncio").addHandler(catcher)
    bad = 0
    for seed in range(lo, hi):
        catcher.records.clear()
        run = run_seed(seed, verbose)
        problems = run.problems + [f"LOGGED ERROR: {r}" for r in catcher.records]
        if problems:
            bad += 1
            print(f"seed {seed}: {describe(run)}")
            for problem in problems[:8]:
                print("   ", problem[:600])
        elif verbose:
            print(f"seed {seed}: ok {describe(run)}")
    print(f"{hi - lo} seeds, {bad} with problems")


if __name__ == "__main__":
    sys.exit("run txn_faults.py, produce_faults.py or churn_faults.py")


def break_metadata(response: m.MetadataResponse, bad: tuple[str, str, int, int | None] | None) -> None:
    """Make a metadata answer wrong as ``bad`` says: ("broker", ...) names a broker of id -1;
    ("extra", topic, index, id) adds an entry of partition ``id`` (n + 1 if None) led as ``index``;
    ("replace", topic, index, id) renames partition ``index`` to ``id`` (n if None)."""
    if bad is None:
        return
    how, topic, index, bad_id = bad
    if how == "broker":
        response.brokers.append(m.MetadataResponseBroker(-1, "nowhere.example", 9))
        return
    for t in response.topics:
        if t.name != topic or not t.partitions:
            continue
        count = len(t.partitions)
        if how == "extra":
            leader = t.partitions[index % count].leader_id
            added = count + 1 if bad_id is None else bad_id
            t.partitions.append(m.MetadataResponsePartition(0, added, leader, 0, [leader], [leader], []))
        else:  # "replace"
            t.partitions[index % count].partition_index = count if bad_id is None else bad_id
