"""Per-record outcomes and ack latency: the time from the ``send()`` call to the broker's ack.

Every record's latency is kept (8 bytes each), so percentiles are exact (to the
microsecond) rather than sampled; a done callback on the record's future stamps the ack time. A record ends
delivered, failed, or unsent (the producer was closed before sending it, as on Ctrl-C).
"""

from __future__ import annotations

import asyncio
import math
import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from aioprod.errors import ProducerClosedError
from aioprod.producer.record_future import RecordFuture, RecordMetadata


@dataclass(frozen=True)
class LatencySummary:
    """Milliseconds; zeros when nothing was acknowledged."""

    count: int
    avg: float
    max: float
    p50: float
    p95: float
    p99: float
    p999: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Window:
    """What happened since the previous :meth:`AckTracker.window` call."""

    acked: int
    failed: int
    avg_ms: float
    max_ms: float


class AckTracker:
    """Counts the outcomes of sent records and keeps each ack's latency.

    ``on_ack(metadata, tag)`` and ``on_error(exc, tag)`` let a command see each outcome
    (e.g. records per partition, or which input line failed) without a second callback per
    record; ``tag`` is whatever was given to :meth:`track` or :meth:`fail`. Records the
    producer's closing failed before they were sent (``ProducerClosedError`` that is not
    ``possibly_persisted``) count as unsent, not failed.
    """

    def __init__(
        self,
        on_ack: Callable[[RecordMetadata, Any], None] | None = None,
        on_error: Callable[[BaseException, Any], None] | None = None,
    ) -> None:
        self.latencies_ms: array[float] = array("d")
        self.sent = 0
        self.acked = 0
        self.failed = 0
        self.unsent = 0
        self.first_error: BaseException | None = None
        self.last_ack: float | None = None
        self.on_ack = on_ack
        self._on_error = on_error
        self._idle = asyncio.Event()
        self._idle.set()
        self._outstanding = 0
        self._window_start = (0, 0)

    @property
    def outstanding(self) -> int:
        """Records handed to the producer whose outcome is not known yet."""
        return self._outstanding

    def counts(self) -> str:
        """``N records delivered, N failed, N unsent``, and how many have no outcome yet, if any."""
        records = f"{self.acked:,} record{'' if self.acked == 1 else 's'}"
        text = f"{records} delivered, {self.failed:,} failed, {self.unsent:,} unsent"
        return text + (f", {self._outstanding:,} unconfirmed" if self._outstanding else "")

    def window(self) -> Window:
        """Acks, failures and ack latency since the previous call (for interim reports)."""
        acked_before, failed_before = self._window_start
        recent = self.latencies_ms[acked_before:]
        self._window_start = (len(self.latencies_ms), self.failed)
        return Window(
            acked=len(recent),
            failed=self.failed - failed_before,
            avg_ms=sum(recent) / len(recent) if recent else 0.0,
            max_ms=max(recent) if recent else 0.0,
        )

    def track(self, future: RecordFuture, sent_at: float, tag: Any = None) -> None:
        """Follow one record; ``sent_at`` is ``time.perf_counter()`` taken before ``send()``."""
        self.sent += 1
        self._outstanding += 1
        self._idle.clear()
        future.add_done_callback(lambda f: self._done(f, sent_at, tag))

    def fail(self, exc: BaseException, tag: Any = None) -> None:
        """Count a failed record (also for one whose ``send()`` itself raised)."""
        if isinstance(exc, ProducerClosedError) and not exc.possibly_persisted:
            self.unsent += 1  # certainly never written: closed (Ctrl-C) before it was sent
            return
        self.failed += 1
        if self.first_error is None:
            self.first_error = exc
        if self._on_error is not None:
            self._on_error(exc, tag)

    def _done(self, future: RecordFuture, sent_at: float, tag: Any) -> None:
        now = time.perf_counter()
        self._outstanding -= 1
        if self._outstanding == 0:
            self._idle.set()
        if future.cancelled():
            self.fail(asyncio.CancelledError("the record's future was cancelled"), tag)
            return
        exc = future.exception()
        if exc is not None:
            self.fail(exc, tag)
            return
        self.acked += 1
        self.last_ack = now
        self.latencies_ms.append((now - sent_at) * 1000)
        if self.on_ack is not None:
            self.on_ack(future.result(), tag)

    async def wait(self) -> None:
        """Until every tracked record is acknowledged or failed."""
        await self._idle.wait()

    def summary(self) -> LatencySummary:
        """Exact avg and max; percentiles (nearest rank) to the microsecond, from a count of
        each distinct microsecond value, so the summary needs memory for the distinct
        latencies, not a second copy of every sample as Python objects."""
        samples = self.latencies_ms
        if not samples:
            return LatencySummary(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        total = len(samples)
        counts = sorted(Counter(round(ms * 1000) for ms in samples).items())
        # Ranks in integers (per mille): in floats 99.9 / 100 * 1000 is 999.0000000000001, one rank too many.
        wanted = [
            (q, max(1, -(-permille * total // 1000))) for q, permille in ((50, 500), (95, 950), (99, 990), (99.9, 999))
        ]
        found: dict[float, float] = {}
        seen = 0
        top = max(samples)
        for micros, count in counts:
            seen += count
            while wanted and wanted[0][1] <= seen:
                # Rounding to the microsecond may go up past the exact maximum: 8.6849 to 8.685.
                found[wanted.pop(0)[0]] = min(micros / 1000, top)
            if not wanted:
                break
        return LatencySummary(
            count=total,
            avg=math.fsum(samples) / total,
            max=top,
            p50=found[50],
            p95=found[95],
            p99=found[99],
            p999=found[99.9],
        )
