"""The driver's side of an exactly-once write from the executors: the second phase.

Every task writes its Spark partition in one transaction and hands it back prepared (see
:class:`aioprod.spark.writer.TransactionalPartitionWrite`). Only once the whole Spark job has
succeeded, and every partition says it wrote all its rows, does the driver commit them; if
the job fails, or any partition could not write, it aborts them all. Handles come back in the
tasks' result rows, and through an accumulator too, which also carries those of tasks that
finished in a job that then failed (whose results never reach the driver).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from aioprod.errors import KafkaError, PreparedTransactionError
from aioprod.producer.producer import Producer
from aioprod.producer.transactions import PreparedTransaction
from aioprod.spark.plan import Plan
from aioprod.sync import SyncProducer

if TYPE_CHECKING:
    from pyspark import Accumulator, SparkContext

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Transactions ended at once from the driver.
_CONCURRENT_ENDS = 32

_NOTHING_COMMITTED = "no transaction of the write was committed (they are aborted): nothing is visible"


class _Handles:
    """A pyspark AccumulatorParam (by duck typing) of encoded handles: a list, concatenated."""

    def zero(self, value: list[str]) -> list[str]:
        return []

    def addInPlace(self, value1: list[str], value2: list[str]) -> list[str]:
        value1.extend(value2)
        return value1


def handle_accumulator(sc: SparkContext | None) -> Accumulator[list[str]] | None:
    """Where tasks also report their prepared transactions; None without a SparkContext (Spark Connect)."""
    return None if sc is None else sc.accumulator([], _Handles())  # type: ignore[arg-type]


def encode(prepared: PreparedTransaction) -> str:
    return json.dumps(dataclasses.asdict(prepared))


def decode(text: str) -> PreparedTransaction:
    return PreparedTransaction(**json.loads(text))


def abort_after_failed_job(plan: Plan, accumulator: Accumulator[list[str]] | None, partitions: int | None) -> None:
    """The Spark job failed, or the write stopped it: abort what its finished tasks prepared,
    and fence the transactional id of each of its ``partitions`` that reported nothing. A task
    stopped mid-write hands nothing back, and its transaction stays open (its input can even
    end as if complete, and the task then prepares); a new producer of its id aborts it."""
    handles = _accumulated(accumulator)
    reported = {prepared.transactional_id for _, prepared in handles}
    unreported = [plan.transactional_id(str(p)) for p in range(partitions or 0)]
    _abort_all(plan, handles, "the Spark job failed", fence=[t for t in unreported if t not in reported])


def _abort_all(
    plan: Plan, handles: Sequence[tuple[int, PreparedTransaction]], why: str, *, fence: Sequence[str] = ()
) -> None:
    """Best effort: the failure the caller reports matters more, and a transaction left open is
    aborted by the coordinator after ``transaction_timeout_ms``, or by a rerun with the same write id."""
    if not handles and not fence:
        return
    try:
        with SyncProducer(plan.options) as producer:
            failures = _end_each(producer, handles, commit=False)
            unfenced = _each_from(producer, fence, lambda p, tid: p._fence(tid))
    except Exception as exc:
        log.warning(
            "could not abort the transactions of write %s (%s; %d prepared, %d more fenced): %r",
            plan.write_id,
            why,
            len(handles),
            len(fence),
            exc,
        )
        return
    for partition, prepared, error in failures:
        log.info("aborting %s (partition %s; %s): %s", prepared.transactional_id, partition, why, error)
    for transactional_id, error in unfenced:
        log.warning(
            "could not abort what %s may have open (%s): %r; it stays open until transaction_timeout_ms, or a rerun "
            "with the same write_id",
            transactional_id,
            why,
            error,
        )


def _accumulated(accumulator: Accumulator[list[str]] | None) -> list[tuple[int, PreparedTransaction]]:
    """What the tasks reported through the accumulator (their partitions unknown: -1)."""
    return [] if accumulator is None else [(-1, decode(text)) for text in accumulator.value]


def end_transactions(
    plan: Plan, rows: Sequence[dict[str, Any]], accumulator: Accumulator[list[str]] | None, seconds: float
) -> tuple[set[int], str | None]:
    """The job succeeded: commit every partition's transaction, or abort them all when a
    partition could not write. Returns the partitions whose rows are not visible, and why."""
    prepared = [(r["spark_partition"], decode(r["prepared"])) for r in rows if r["prepared"]]
    if any(r["aborted"] or r["failed"] for r in rows):
        # Also what other attempts of the tasks prepared (the accumulator has every successful one).
        seen = {h for _, h in prepared}
        extra = [(p, h) for p, h in _accumulated(accumulator) if h not in seen]
        _abort_all(plan, prepared + extra, "a partition could not write")
        return {r["spark_partition"] for r in rows}, _NOTHING_COMMITTED
    failures = end_all(plan, prepared, commit=True)
    if not failures:
        return set(), None
    late = ""
    timeout_ms = plan.options["transaction_timeout_ms"]
    if seconds * 1000 > timeout_ms:
        late = (
            f" The write took {seconds:.0f}s, longer than transaction_timeout_ms ({timeout_ms} ms): the "
            "coordinator may have aborted transactions that waited that long."
        )
    details = "; ".join(f"partition {p}: {_outcome(error)}" for p, _, error in failures)
    message = (
        f"{len(failures)} of {len(prepared)} partitions could not be committed ({details}).{late} The other "
        f"partitions are committed. Run the write again with write_id={plan.write_id!r} and the same DataFrame "
        "(same partitioning): it skips the committed partitions and writes the rest."
    )
    return {p for p, _, _ in failures}, message


def _outcome(error: BaseException) -> str:
    if isinstance(error, PreparedTransactionError):
        return f"not committed, its rows are not visible ({error})"
    return f"commit in doubt ({type(error).__name__}: {error})"


def end_all(
    plan: Plan, handles: Sequence[tuple[int, PreparedTransaction]], *, commit: bool
) -> list[tuple[int, PreparedTransaction, KafkaError]]:
    """Commit (or abort) every transaction from one producer on the driver; the ones that
    failed, with their errors."""
    if not handles:
        return []
    with SyncProducer(plan.options) as producer:
        return _end_each(producer, handles, commit=commit)


def _end_each(
    producer: SyncProducer, handles: Sequence[tuple[int, PreparedTransaction]], *, commit: bool
) -> list[tuple[int, PreparedTransaction, KafkaError]]:
    def end(p: Producer, handle: tuple[int, PreparedTransaction]) -> Awaitable[None]:
        prepared = handle[1]
        return p.commit_prepared_transaction(prepared) if commit else p.abort_prepared_transaction(prepared)

    return [(partition, prepared, error) for (partition, prepared), error in _each_from(producer, handles, end)]


def _each_from(
    producer: SyncProducer, items: Sequence[T], call: Callable[[Producer, T], Awaitable[None]]
) -> list[tuple[T, KafkaError]]:
    """``call`` for every item, from ``producer``'s loop, a few at a time; the items whose call
    failed, with their errors."""
    if not items:
        return []
    waves = -(-len(items) // _CONCURRENT_ENDS)
    timeout = waves * (producer.config.max_block_ms / 1000) + 30
    return producer.submit(_each, items, call).result(timeout)


async def _each(
    producer: Producer, items: Iterable[T], call: Callable[[Producer, T], Awaitable[None]]
) -> list[tuple[T, KafkaError]]:
    limit = asyncio.Semaphore(_CONCURRENT_ENDS)

    async def one(item: T) -> tuple[T, KafkaError] | None:
        async with limit:
            try:
                await call(producer, item)
            except KafkaError as exc:
                return item, exc
            return None

    outcomes = await asyncio.gather(*(one(item) for item in items))
    return [o for o in outcomes if o is not None]
