"""Seeded randomized harness: the public API used by several tasks at once, cancelled anywhere.

Several application tasks call send(), send_and_wait(), send_many() (lists and generators),
flush() (with and without timeouts), partitions_for(), metrics()/metrics_snapshot() and, for a
transactional producer, begin/commit/abort_transaction and send_offsets_to_transaction, in
random interleavings; a chaos task cancels random application tasks at random moments (and
calls are wrapped in asyncio.timeout / wait_for), light broker faults happen (a stalled node,
a dropped connection); at a random moment one or several tasks close() the producer (timeouts
0, small, None; some of those closes cancelled). Then it checks:

- no hang: close() returns, and every application call returns within HANG after it;
- every RecordFuture / send_many future resolved;
- a cancelled send() queued nothing (docs/delivery.md): its record is never written;
- with idempotence no record is written twice;
- calls made once close() began raise ProducerClosedError (flush() returns), nothing else;
- asyncio reports nothing (task exception never retrieved, task destroyed pending, ...);
- no aioprod task runs after close(); the buffer memory is all given back;
- transactions: read_committed sees exactly the committed transactions' acknowledged records,
  none of an aborted one, all or nothing of one whose outcome the caller never learnt.

    PYTHONPATH=. .venv/bin/python tests/engine/concurrent_api.py 0 300
    PYTHONPATH=. .venv/bin/python tests/engine/concurrent_api.py 17 18 -v
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import random
import sys
from collections import deque
from dataclasses import dataclass, field

from aioprod import Producer, TopicPartition
from aioprod.errors import KafkaError, ProducerClosedError
from aioprod.producer.batch import SendGroup
from aioprod.producer.producer import _CLOSED, _CLOSING
from tests.engine.fault_runs import HANG, SeededRun, Violation, command_line, run_in_virtual_time
from tests.engine.txn_faults import COORD_APIS
from tests.fakes.cluster import ScriptedCluster
from tests.fakes.coordinator import Lost

TOPICS = {"a": [1, 2, 3], "b": [2, 3]}
SLOW_CLOSE = 10.0  # virtual seconds: everything is healed before the final close
ALL_TOPICS = {**TOPICS, "late": [1, 3]}  # "late" is created a while into the run


@dataclass
class Rec:
    value: bytes
    topic: str
    how: str  # send / send_and_wait / send_many
    future: object = None  # a twin of the RecordFuture (its outcome, whatever the caller did with it)
    group: object = None  # (send_many future, index)
    #: True: queued; False: certainly not queued (the call raised or was cancelled before);
    #: None: unknown (send_and_wait cancelled or failed: before or after queuing)
    queued: bool | None = True
    gen: int = -1  # the transaction generation it was queued in
    after_close: bool = False


@dataclass
class Call:
    what: str
    task: str
    started_closing: bool  # close() had begun when the call was made
    started_closed: bool  # close() had returned when the call was made
    outcome: str = "pending"
    t_start: float = 0.0
    t_end: float | None = None


@dataclass
class TxnInfo:
    gen: int
    status: str = "open"  # committed / aborted / unknown
    offsets: list[int] = field(default_factory=list)


class Run(SeededRun):
    def __init__(self, seed: int, verbose: bool = False) -> None:
        super().__init__(seed, verbose)
        self.recs: list[Rec] = []
        self.calls: list[Call] = []
        self.counter = 0
        self.apps: list[asyncio.Task] = []
        self.closers: list[asyncio.Task] = []
        self.txns: dict[int, TxnInfo] = {}
        self.offset_counter = 0
        self.opts: dict = {}
        self.transactional = False
        self.closing_started = False
        self.closed = False
        self.asyncio_reports: list[str] = []
        self.last_call: dict = {}
        self.wait_for_tasks: set = set()

    # -- faults and chaos --------------------------------------------------------------------------

    def fault(self) -> None:
        c, rng = self.cluster, self.rng
        n = rng.choice(list(c.nodes))
        node = c.nodes[n]
        kinds = ["stall", "stall", "disconnect", "disconnect", "delay"]
        if self.transactional:
            kinds += ["coord", "coord", "coord_move"]
        kind = rng.choice(kinds)
        if kind == "coord":
            api = rng.choice(COORD_APIS)
            code = rng.choice(
                [Lost, 51, 16, 15]
            )  # lost answer, CONCURRENT_TRANSACTIONS, NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE
            c.coordinator.script.setdefault(api, deque()).append(code)
            self.log(f"FAULT coordinator answers api {api} with {code}")
            return
        if kind == "coord_move":
            c.coordinator.move_to(n)
            self.log(f"FAULT coordinator moves to {n}")
            return
        loop = asyncio.get_running_loop()
        if kind == "stall":
            node.stalling = True
            after = rng.choice([0.01, 0.3, 3.0])
            self.log(f"FAULT node {n} stalls produce for {after}s")
            loop.call_later(after, node.release)
        elif kind == "disconnect":
            self.log(f"FAULT disconnect node {n}")
            c.disconnect(n)
        else:
            node.delay = rng.choice([0.05, 0.5])
            self.log(f"FAULT node {n} delays answers {node.delay}s")
            loop.call_later(1.0, setattr, node, "delay", 0.0)

    async def chaos(self) -> None:
        rng = self.rng
        while True:
            await asyncio.sleep(rng.expovariate(1 / self.chaos_mean))
            r = rng.random()
            if r < (0.5 if self.transactional else 0.25):
                self.fault()
            else:
                victims = [t for t in self.apps + self.closers if not t.done()]
                if victims:
                    v = rng.choice(victims)
                    self.log(f"CHAOS cancel {v.get_name()}")
                    v.cancel()

    def cancel_in_turns(self, task: asyncio.Task, c: Call, turns: int) -> None:
        """Cancel ``task`` after ``turns`` turns of the loop, if call ``c`` is still running then."""
        loop = asyncio.get_running_loop()

        def hop(left: int) -> None:
            if c.outcome != "pending" or task.done():
                return
            if left:
                loop.call_soon(hop, left - 1)
            else:
                self.log(f"CHAOS cancel {task.get_name()} in {c.what} after {turns} turns")
                task.cancel()

        loop.call_soon(hop, turns)

    def heal(self) -> None:
        self.cluster.coordinator.script.clear()
        for node in self.cluster.nodes.values():
            node.release()
            node.delay = 0.0

    # -- calls ---------------------------------------------------------------------------------------

    def value(self) -> bytes:
        self.counter += 1
        return b"%d" % self.counter + (
            b":" + b"x" * self.rng.choice([10, 200, 1500]) if self.rng.random() < 0.3 else b""
        )

    def gen(self, p: Producer) -> int:
        return p._txn.generation if p._txn is not None else 0

    async def wrapped(self, aw, name: str):
        """``aw`` maybe under asyncio.timeout or wait_for (a small bound)."""
        rng = self.rng
        r = rng.random()
        if r < 0.15:
            t = rng.choice([0.0, 0.001, 0.05, 0.5])
            self.log(f"  ({name} under asyncio.timeout({t}))")
            async with asyncio.timeout(t):
                return await aw
        if r < 0.3:
            t = rng.choice([0.0, 0.001, 0.05, 0.5])
            self.log(f"  ({name} under wait_for {t})")
            self.wait_for_tasks.add(asyncio.current_task())
            return await asyncio.wait_for(aw, t)
        return await aw

    async def call(self, task: str, what: str, fn):
        """Run one API call, recording how it ended; CancelledError goes on up."""
        prod = self.producer
        loop = asyncio.get_running_loop()
        c = Call(what, task, prod._state in (_CLOSING, _CLOSED), prod._state == _CLOSED)
        c.t_start = loop.time()
        self.calls.append(c)
        self.last_call[asyncio.current_task()] = c
        if self.rng.random() < self.self_cancel:
            self.cancel_in_turns(asyncio.current_task(), c, self.rng.randint(0, 40))
        try:
            result = await fn()
        except asyncio.CancelledError:
            c.outcome, c.t_end = "cancelled", loop.time()
            raise
        except TimeoutError as exc:
            c.t_end = loop.time()
            if isinstance(exc, KafkaError):
                c.outcome = f"raised {type(exc).__name__}"
                self.log(f"  {task} {what} raised {type(exc).__name__}: {exc}")
                self.check_error(c, exc)
                return None
            c.outcome = "timed out (harness)"
            raise
        except Violation:
            raise
        except BaseException as exc:
            c.outcome, c.t_end = f"raised {type(exc).__name__}", loop.time()
            self.log(f"  {task} {what} raised {type(exc).__name__}: {exc}")
            self.check_error(c, exc)
            return None
        c.outcome, c.t_end = "ok", loop.time()
        return result

    def check_error(self, c: Call, exc: BaseException) -> None:
        if not isinstance(exc, KafkaError):
            self.problems.append(f"NON-KAFKA: {c.task} {c.what} raised {exc!r}")
        elif (
            c.started_closing
            and not isinstance(exc, ProducerClosedError)
            and not (c.what.startswith("flush") and not c.started_closed)
        ):
            self.problems.append(
                f"WRONG-ERROR-AFTER-CLOSE: {c.task} {c.what} "
                f"(made after close() {'returned' if c.started_closed else 'began'}) "
                f"raised {type(exc).__name__}: {exc}"
            )

    async def op_send(self, p: Producer, task: str) -> None:
        rng = self.rng
        topic = rng.choice(list(ALL_TOPICS))
        rec = Rec(self.value(), topic, "send", after_close=self.closing_started)
        self.recs.append(rec)
        key = rng.choice([None, b"k1", b"k2"])
        self.log(f"{task} send {rec.value[:10]!r}")
        rec.queued = False
        try:
            fut = await self.call(task, "send", lambda: self.wrapped(p.send(topic, rec.value, key=key), "send"))
        except (asyncio.CancelledError, TimeoutError) as exc:
            self.log(f"  {task} send {rec.value[:10]!r} cancelled")
            if isinstance(exc, asyncio.CancelledError) and asyncio.current_task() in self.wait_for_tasks:
                rec.queued = None  # asyncio.wait_for (3.11) may drop the result when the outer task is cancelled
            raise
        if fut is None:
            return
        rec.queued = True
        rec.gen = self.gen(p)
        rec.future = fut.twin() if hasattr(fut, "twin") else fut
        mode = rng.random()
        if mode < 0.3:
            with contextlib.suppress(KafkaError):
                await self.wrapped(fut, "await fut")  # cancelling the wait cancels that future only
        elif mode < 0.4:
            with contextlib.suppress(KafkaError):
                await self.wrapped(asyncio.shield(fut), "await shield(fut)")

    async def op_send_and_wait(self, p: Producer, task: str) -> None:
        topic = self.rng.choice(list(ALL_TOPICS))
        rec = Rec(self.value(), topic, "send_and_wait", queued=None, gen=self.gen(p), after_close=self.closing_started)
        self.recs.append(rec)
        self.log(f"{task} send_and_wait {rec.value[:10]!r}")
        gen = self.gen(p)
        md = await self.call(
            task, "send_and_wait", lambda: self.wrapped(p.send_and_wait(topic, rec.value), "send_and_wait")
        )
        if md is not None:
            rec.queued = True
            rec.gen = gen
            rec.future = md  # its metadata

    async def op_send_many(self, p: Producer, task: str) -> None:
        rng = self.rng
        topic = rng.choice(list(ALL_TOPICS))
        n = rng.randint(1, 15)
        vals = [self.value() for _ in range(n)]
        recs = [Rec(v, topic, "send_many", queued=False, after_close=self.closing_started) for v in vals]
        self.recs.extend(recs)
        keys = [rng.choice([b"k1", None]) for _ in range(n)] if rng.random() < 0.3 else None
        gen_values = rng.random() < 0.4
        values = (v for v in vals) if gen_values else vals
        part = rng.choice([None, None, 0])
        self.log(f"{task} send_many {n} {'generator' if gen_values else 'list'} first={vals[0][:10]!r}")
        gen = self.gen(p)
        try:
            fut = await self.call(
                task,
                "send_many",
                lambda: self.wrapped(p.send_many(topic, values, keys=keys, partition=part), "send_many"),
            )
        except (asyncio.CancelledError, TimeoutError) as exc:
            cancel = exc if isinstance(exc, asyncio.CancelledError) else exc.__cause__
            queued = getattr(cancel, "_aioprod_queued", None)
            count, group = queued if queued is not None else (0, None)
            self.log(f"  {task} send_many cancelled after queuing {count}")
            for i, r in enumerate(recs[:count]):
                r.queued, r.group, r.gen = True, (group, i), gen
            if isinstance(exc, asyncio.CancelledError) and asyncio.current_task() in self.wait_for_tasks:
                # asyncio.wait_for (3.11) drops the inner call's result when the outer task is
                # cancelled as it finishes: unknown
                for r in recs[count:]:
                    r.queued = None
            raise
        if fut is None:
            return
        for i, r in enumerate(recs):
            r.queued, r.group, r.gen = True, (fut, i), gen
        if rng.random() < 0.3:
            with contextlib.suppress(KafkaError):
                await self.wrapped(asyncio.shield(fut), "await send_many future")

    async def op_flush(self, p: Producer, task: str) -> None:
        timeout = self.rng.choice([None, None, 0.0, 0.01, 1.0])
        self.log(f"{task} flush({timeout})")
        await self.call(task, f"flush({timeout})", lambda: self.wrapped(p.flush(timeout), "flush"))

    async def op_partitions_for(self, p: Producer, task: str) -> None:
        topic = self.rng.choice(list(ALL_TOPICS))
        self.log(f"{task} partitions_for({topic})")
        parts = await self.call(task, "partitions_for", lambda: self.wrapped(p.partitions_for(topic), "partitions_for"))
        if parts is not None and parts != list(range(len(ALL_TOPICS[topic]))):
            self.problems.append(f"PARTITIONS: partitions_for({topic}) gave {parts}")

    async def op_metrics(self, p: Producer, task: str) -> None:
        self.log(f"{task} metrics")
        try:
            m = p.metrics()
            s = p.metrics_snapshot()
        except BaseException as exc:
            self.problems.append(f"METRICS raised {exc!r}")
            return
        if not isinstance(m, dict) or s is None:
            self.problems.append("METRICS: odd result")

    async def op_close(self, p: Producer, task: str) -> None:
        timeout = self.rng.choice([None, 0, 0.01, 0.5, 5.0])
        self.log(f"{task} close({timeout})")
        self.closing_started = True
        await self.call(task, f"close({timeout})", lambda: self.wrapped(p.close(timeout), "close"))

    async def closer(self, p: Producer, name: str) -> None:
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await self.op_close(p, name)

    # transactions

    async def op_begin(self, p: Producer, task: str) -> None:
        self.log(f"{task} begin_transaction")

        async def begin():
            p.begin_transaction()

        await self.call(task, "begin_transaction", begin)
        if self.last_call[asyncio.current_task()].outcome == "ok":
            g = self.gen(p)
            self.txns[g] = TxnInfo(g)
            self.log(f"  began txn {g}")

    async def op_end(self, p: Producer, task: str, commit: bool) -> None:
        what = "commit_transaction" if commit else "abort_transaction"
        g = self.gen(p)
        self.log(f"{task} {what} (txn {g})")
        try:
            await self.call(
                task, what, lambda: self.wrapped(p.commit_transaction() if commit else p.abort_transaction(), what)
            )
        except (asyncio.CancelledError, TimeoutError):
            if g in self.txns and self.txns[g].status == "open":
                self.txns[g].status = "unknown"
            raise
        info = self.txns.get(g)
        if info is None:
            return
        if self.last_call[asyncio.current_task()].outcome == "ok":
            new = "committed" if commit else "aborted"
            if info.status in ("committed", "aborted") and info.status != new:
                self.problems.append(f"TXN {g}: {what} succeeded but it was {info.status}")
            info.status = new
            self.log(f"  txn {g} {new}")
        elif info.status == "open":
            info.status = "unknown"

    async def op_offsets(self, p: Producer, task: str) -> None:
        self.offset_counter += 1
        off = self.offset_counter
        g = self.gen(p)
        self.log(f"{task} send_offsets_to_transaction in={off} (txn {g})")
        if g in self.txns:
            self.txns[g].offsets.append(off)
        await self.call(
            task,
            "send_offsets_to_transaction",
            lambda: self.wrapped(p.send_offsets_to_transaction({TopicPartition("in", 0): off}, "g"), "offsets"),
        )

    # -- the workload ----------------------------------------------------------------------------

    async def app(self, p: Producer, name: str, steps: int) -> None:
        rng = self.rng
        ops = [
            (self.op_send, 30),
            (self.op_send_and_wait, 10),
            (self.op_send_many, 15),
            (self.op_flush, 8),
            (self.op_partitions_for, 4),
            (self.op_metrics, 4),
        ]
        if self.transactional:
            ops += [
                (self.op_begin, 8),
                (lambda p, t: self.op_end(p, t, True), 6),
                (lambda p, t: self.op_end(p, t, False), 3),
                (self.op_offsets, 3),
            ]
        funcs, weights = zip(*ops, strict=True)
        for _ in range(steps):
            if rng.random() < 0.3:
                await asyncio.sleep(rng.choice([0, 0.001, 0.05, 0.5]))
            op = rng.choices(funcs, weights)[0]
            self.wait_for_tasks.discard(asyncio.current_task())
            await op(p, name)

    async def app_task(self, p: Producer, name: str, steps: int) -> None:
        # a cancelled app task starts again (as a service's request handler would), until its steps are done
        left = steps
        while left > 0:
            try:
                await self.app(p, name, 1)
            except (asyncio.CancelledError, TimeoutError):
                cur = asyncio.current_task()
                if cur is not None and cur.cancelling():
                    cur.uncancel()
            left -= 1

    def options(self) -> dict:
        rng = self.rng
        self.transactional = rng.random() < 0.35
        opts: dict = {
            "linger_ms": rng.choice([0, 5, 50]),
            "batch_size": rng.choice([300, 16384]),
            "buffer_memory": rng.choice([5000, 20000, 32 * 1024 * 1024]),
            "max_block_ms": rng.choice([60_000, 2_000, 200]),
            "request_timeout_ms": rng.choice([30_000, 1_000]),
            "retry_backoff_ms": rng.choice([10, 100]),
        }
        if not self.transactional and rng.random() < 0.2:
            opts["enable_idempotence"] = False
            opts["acks"] = rng.choice([1, "all"])
        opts["delivery_timeout_ms"] = rng.choice([120_000, opts["request_timeout_ms"] + opts["linger_ms"] + 500])
        if self.transactional:
            opts["transactional_id"] = "t1"
        return opts

    def on_asyncio_error(self, loop, context) -> None:
        msg = context.get("message", "")
        exc = context.get("exception")
        text = f"{msg} {exc!r}" if exc is not None else msg
        task = context.get("task") or context.get("future")
        if task is not None:
            text += f" [{task!r}"[:300] + "]"
        self.asyncio_reports.append(text)

    async def main(self) -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(self.on_asyncio_error)
        self.t0 = loop.time()
        c = self.cluster = self.new_cluster(ScriptedCluster, TOPICS)
        rng = self.rng
        self.chaos_mean = rng.choice([0.05, 0.3, 1.5])
        self.self_cancel = rng.choice([0.1, 0.3, 0.6])
        late_at = rng.choice([0.0, 0.05, 1.0, 5.0])
        asyncio.get_running_loop().call_later(late_at, c.create_topic, "late", [1, 3])
        opts = self.opts = self.options()
        if self.transactional and rng.random() < 0.3:
            c.coordinator.transaction_version = 2
        self.log(f"options {opts} tv={c.coordinator.transaction_version}")
        p = self.producer = Producer(bootstrap_servers=c.bootstrap, **opts)
        p._partitioner._random = random.Random(self.seed)
        if rng.random() < 0.5:
            p._lanes_on = False  # timestamps follow the virtual clock (the compiled lanes read the wall clock)
        try:
            await self.guarded("start", p.start())
        except KafkaError as exc:
            self.problems.append(f"start failed {exc!r}")
            return
        before = set(asyncio.all_tasks())
        chaos = asyncio.ensure_future(self.chaos())
        n_apps = rng.randint(2, 6)
        self.log(f"{n_apps} application tasks")
        for i in range(n_apps):
            t = asyncio.ensure_future(self.app_task(p, f"app{i}", rng.randint(5, 30)))
            t.set_name(f"app{i}")
            self.apps.append(t)
        # closers: one or several, at a random moment
        close_at = rng.choice([0.0, 0.01, 0.5, 3.0, 20.0, None])
        n_closers = rng.choice([1, 1, 2, 3])
        if close_at is not None:
            await asyncio.sleep(close_at)
            for i in range(n_closers):
                t = asyncio.ensure_future(self.closer(p, f"closer{i}"))
                t.set_name(f"closer{i}")
                self.closers.append(t)
                if rng.random() < 0.5:
                    await asyncio.sleep(rng.choice([0, 0.001, 0.1]))
        try:
            # the application tasks run their course (or hang)
            with contextlib.suppress(Violation):
                await self.guarded("application tasks", asyncio.wait(self.apps))
        finally:
            chaos.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await chaos
        self.heal()
        self.log("final close()")
        self.closing_started = True
        t0 = loop.time()
        with contextlib.suppress(Violation):
            await self.guarded("final close", p.close())
        self.closed = True
        self.close_took = loop.time() - t0
        self.closed_at = loop.time()
        self.log(f"final close took {self.close_took:.3f}s")
        # every application call returns within HANG of close()
        pending = [t for t in self.apps + self.closers if not t.done()]
        if pending:
            _done, still = await asyncio.wait(pending, timeout=HANG)
            for t in still:
                self.problems.append(f"HANG: {t.get_name()} did not return after close(): {t!r}"[:400])
                t.cancel()
        for t in self.apps + self.closers:
            if t.done() and not t.cancelled() and t.exception() is not None:
                self.problems.append(f"APP-TASK-CRASH {t.get_name()}: {t.exception()!r}")
        # calls running when close() returned end soon after it
        for c in self.calls:
            if c.t_start <= self.closed_at and (c.t_end is None or c.t_end > self.closed_at + 1.0):
                self.problems.append(
                    f"LATE: {c.task} {c.what} (started {c.t_start - self.t0:.3f}) ended "
                    f"{'never' if c.t_end is None else f'{c.t_end - self.closed_at:.3f}s'} after close() returned"
                )
        # every call after close raises ProducerClosedError
        await self.after_close_calls(p)
        await asyncio.sleep(1.0)
        # tasks of aioprod's own code (the fake cluster's connection servers are not the producer's)
        left = [
            t
            for t in asyncio.all_tasks()
            if t not in before
            and not t.done()
            and t is not asyncio.current_task()
            and "/aioprod/" in getattr(getattr(t.get_coro(), "cr_code", None), "co_filename", "")
        ]
        for t in left:
            self.problems.append(f"TASK-LEFT after close(): {t!r}"[:300])
        self.check_closed(p)
        self.check()
        gc.collect()

    async def after_close_calls(self, p: Producer) -> None:
        self.closing_started = self.closed = True
        tp = TopicPartition("in", 0)
        calls = [
            ("send", lambda: p.send("a", b"late")),
            ("send_and_wait", lambda: p.send_and_wait("a", b"late2")),
            ("send_many", lambda: p.send_many("a", [b"late3"])),
            ("send_many(gen)", lambda: p.send_many("a", (v for v in [b"late4"]))),
            ("partitions_for", lambda: p.partitions_for("a")),
            ("begin_transaction", lambda: _as_coro(p.begin_transaction)),
            ("commit_transaction", lambda: p.commit_transaction()),
            ("abort_transaction", lambda: p.abort_transaction()),
            ("send_offsets_to_transaction", lambda: p.send_offsets_to_transaction({tp: 1}, "g")),
        ]
        for what, fn in calls:
            try:
                async with asyncio.timeout(HANG):
                    await fn()
            except ProducerClosedError:
                continue
            except TimeoutError:
                self.problems.append(f"HANG: {what} after close() did not return")
            except BaseException as exc:
                self.problems.append(f"AFTER-CLOSE: {what} raised {type(exc).__name__}: {exc}")
            else:
                self.problems.append(f"AFTER-CLOSE: {what} returned normally")
        try:
            await p.flush()
            await p.flush(0)
            await p.close()
            await p.close(0)
            p.metrics()
            p.metrics_snapshot()
        except BaseException as exc:
            self.problems.append(f"AFTER-CLOSE: flush/close/metrics raised {exc!r}")

    # -- checks ----------------------------------------------------------------------------------------

    def outcome(self, rec: Rec):
        if rec.how == "send_and_wait":
            return rec.future  # metadata or None
        return super().outcome(rec)

    def check_closed(self, p: Producer) -> None:
        for rec in self.recs:
            if rec.queued and self.outcome(rec) == "pending":
                self.problems.append(f"UNRESOLVED: {rec.how} record {rec.value[:12]!r} unresolved after close()")
        self.check_emptied(p._accumulator)

    def check(self) -> None:
        c = self.cluster
        idem = self.opts.get("enable_idempotence", True)
        by_value = {r.value: r for r in self.recs}
        for r in self.recs:
            if r.group is not None and r.group[0] is not None:
                first = UNQUEUED.get(id(r.group[0]))
                if first is not None and r.group[1] >= first:
                    r.queued = False
        raw: dict[bytes, list[tuple[str, int, int]]] = {}
        committed: dict[bytes, int] = {}
        for t in ALL_TOPICS:
            for idx, part in enumerate(c.topics.get(t, [])):
                for batch in part.log:
                    for j, v in enumerate(batch.values):
                        raw.setdefault(v, []).append((t, idx, batch.base_offset + j))
                for v in part.committed:
                    committed[v] = committed.get(v, 0) + 1
        for v, where in raw.items():
            if v not in by_value:
                self.problems.append(f"UNKNOWN record {v[:12]!r} in the log")
            if idem and len(where) > 1:
                self.problems.append(f"DUPLICATE: {v[:12]!r} written {len(where)} times: {where}")
        for rec in self.recs:
            where = raw.get(rec.value, [])
            if rec.queued is False and where:
                self.problems.append(
                    f"NOT-QUEUED-WRITTEN: {rec.how} {rec.value[:12]!r} (its call raised or was cancelled before "
                    f"queuing) is in the log {where}"
                )
            if not rec.queued:
                continue
            out = self.outcome(rec)
            if isinstance(out, tuple) and (out.topic, out.partition, out.offset) not in where:
                self.problems.append(f"ACK-LIE: {rec.value[:12]!r} acked at {out}, log has {where}")
            if isinstance(out, BaseException) and not isinstance(out, KafkaError):
                self.problems.append(f"record {rec.value[:12]!r} failed with non-Kafka {out!r}")
        if self.transactional:
            self.check_transactions(raw, committed)

    def check_transactions(self, raw, committed) -> None:
        by_gen: dict[int, list[Rec]] = {}
        for rec in self.recs:
            if rec.queued:
                by_gen.setdefault(rec.gen, []).append(rec)
            elif rec.queued is False and rec.value in committed:
                self.problems.append(f"VISIBLE-NOT-QUEUED: {rec.value[:12]!r} ({rec.how})")
        for v, n in committed.items():
            if n > 1:
                self.problems.append(f"DUPLICATE committed {v[:12]!r} x{n}")
        for g, recs in by_gen.items():
            info = self.txns.get(g)
            status = info.status if info is not None else "?"
            acked = [r for r in recs if isinstance(self.outcome(r), tuple)]
            vis = [r for r in acked if r.value in committed]
            vis_any = [r for r in recs if r.value in committed]
            if status == "committed":
                if len(vis) != len(acked):
                    self.problems.append(
                        f"LOST: txn {g} committed but {len(acked) - len(vis)} acked records not visible"
                    )
                failed = [r for r in recs if isinstance(self.outcome(r), BaseException) and r.how != "send_and_wait"]
                if failed:
                    self.problems.append(
                        f"COMMITTED-WITH-FAILED: txn {g} committed, {len(failed)} records failed: "
                        f"{self.outcome(failed[0])!r}"[:400]
                    )
            elif status == "aborted" and vis_any:
                self.problems.append(f"VISIBLE-ABORTED: txn {g} aborted, {len(vis_any)} records visible")
            elif vis and len(vis) != len(acked):
                self.problems.append(
                    f"PARTIAL: txn {g} ({status}) has {len(vis)} of {len(acked)} acked records visible"
                )
        got = self.cluster.coordinator.committed.get("g", {}).get(("in", 0))
        if got is not None:
            owner = [i for i in self.txns.values() if got in i.offsets]
            if owner and owner[0].status == "aborted":
                self.problems.append(f"OFFSETS: committed offset {got} belongs to aborted txn {owner[0].gen}")


async def _as_coro(fn):
    return fn()


#: send_many future -> index of its first record the call could not queue (group.failed from send_many)
UNQUEUED: dict[int, int] = {}


def _patched_failed(self, start, count, error, errors=None):
    if sys._getframe(1).f_code.co_name == "send_many":
        UNQUEUED[id(self.future)] = start
    return _orig_failed(self, start, count, error, errors)


_orig_failed = SendGroup.failed


def run_seed(seed: int, verbose: bool = False) -> Run:
    run = Run(seed, verbose)
    UNQUEUED.clear()
    SendGroup.failed = _patched_failed
    try:
        run_in_virtual_time(seed, run.main, run.problems)
    finally:
        SendGroup.failed = _orig_failed
    gc.collect()
    run.problems.extend(f"ASYNCIO: {r}" for r in run.asyncio_reports)
    if getattr(run, "close_took", 0) > SLOW_CLOSE:
        run.problems.append(f"SLOW-CLOSE: the final close() took {run.close_took:.3f}s")
    return run


if __name__ == "__main__":
    command_line(
        run_seed,
        lambda run: (
            f"{len(run.recs)} records tx={run.transactional} "
            f"{sorted(collections.Counter(t.status for t in run.txns.values()).items())} {run.opts}"
        ),
        sys.argv,
    )
