"""The Spark job of an executors-mode write, tagged: so that a write stopped on the driver
cancels its own job, and only it, and knows when the job's tasks have ended.

pyspark's Ctrl-C handler means to cancel every job and raise ``KeyboardInterrupt``, but while
the driver waits in ``collect()`` its call to the JVM re-enters the one Ctrl-C interrupted and
fails: the job runs on, its tasks writing and preparing transactions nobody ends.
"""

from __future__ import annotations

import logging
import time
import uuid
from types import TracebackType
from typing import TYPE_CHECKING, Any

from aioprod.spark import _pyspark

if TYPE_CHECKING:
    from pyspark import SparkContext

log = logging.getLogger(__name__)

#: How often the status of a stopped job's tasks is read while waiting for them to end.
_POLL_SECONDS = 0.1


class WriteJob:
    """Tags the jobs started in its block (on this thread) as the write's own."""

    def __init__(self, sc: SparkContext | None) -> None:
        self._sc = sc
        self._tag = f"aioprod-write-{uuid.uuid4().hex}"
        self._thread: Any = None

    def __enter__(self) -> WriteJob:
        if self._sc is not None:
            self._sc.addJobTag(self._tag)
            self._thread = _pyspark.jvm_thread(self._sc)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._sc is not None:
            # After Ctrl-C this may be another JVM thread (py4j dropped the interrupted
            # connection), where the tag is not set: removing it there is harmless.
            try:
                self._sc.removeJobTag(self._tag)
            except Exception as exc:  # a stopped SparkContext: the error the block raised matters more
                log.debug("could not remove job tag %s: %r", self._tag, exc)

    def cancel(self) -> bool:
        """Cancel the write's job, if it still runs. Best effort: it runs while an error is
        raised (the job's, or Ctrl-C), which must reach the caller as it is; a SparkContext that
        stopped, which failed the job, refuses the call. Whether the call was made."""
        if self._sc is not None:
            try:
                self._sc.cancelJobsWithTag(self._tag)
            except Exception as exc:
                log.warning("could not cancel the Spark job of the write: %r", exc)
                return False
        return True

    def stop(self, timeout: float) -> None:
        """Cancel the write's job and, after Ctrl-C, every job the interrupted call starts until
        it returns (at most ``timeout`` seconds): Ctrl-C while the JVM plans the query comes
        before the job exists, and the JVM, which knows nothing of the Ctrl-C, starts it later."""
        sc, thread = self._sc, self._thread
        if not self.cancel() or sc is None or thread is None:
            return
        deadline = time.monotonic() + timeout
        while _pyspark.still_calling(sc, thread):
            if time.monotonic() > deadline:
                log.warning(
                    "the interrupted Spark call of the write still runs after %.0f s: a job it starts later runs",
                    timeout,
                )
                return
            time.sleep(_POLL_SECONDS)
            if not self.cancel():
                return

    def wait_for_tasks(self, timeout: float) -> int | None:
        """Wait, at most ``timeout`` seconds, until the tasks of the write's (cancelled or failed)
        job have ended. Returns how many Spark partitions the job writes (the units whose
        transactions may be open), or None when unknown: no SparkContext (Spark Connect), or no
        job started."""
        try:
            return self._wait_for_tasks(timeout)
        except Exception as exc:  # as in cancel()
            log.warning("could not learn whether the tasks of the stopped write ended: %r", exc)
            return None

    def _wait_for_tasks(self, timeout: float) -> int | None:
        sc = self._sc
        if sc is None:
            return None
        _pyspark.drain_listener_bus(sc, timeout)  # a job cancelled as it started: its start is known
        jobs = _pyspark.job_ids_with_tag(sc, self._tag)
        if not jobs:
            return None
        tracker = sc.statusTracker()
        started = time.monotonic()
        deadline = started + timeout
        while True:
            # A job's end is heard after its tasks' starts: once no job runs, every task started
            # is counted until Spark has stopped it (its Python worker may outlive it a moment:
            # docs/spark.md says what that leaves).
            infos = [tracker.getJobInfo(job) for job in jobs]
            stages = [tracker.getStageInfo(stage) for info in infos if info is not None for stage in info.stageIds]
            running = any(info is not None and info.status == "RUNNING" for info in infos)
            active = sum(stage.numActiveTasks for stage in stages if stage is not None)
            if not running and not active:
                log.info("the tasks of the stopped write ended after %.1f s", time.monotonic() - started)
                break
            if time.monotonic() > deadline:
                log.warning(
                    "%d task(s) of the stopped write still run after %.0f s: a transaction one of them opens later "
                    "stays open until transaction_timeout_ms, or a rerun with the same write_id",
                    active,
                    timeout,
                )
                break
            time.sleep(_POLL_SECONDS)
        # The write's own job (its last: adaptive execution runs the stages before it as jobs of
        # their own) writes one Spark partition per task of its last stage.
        last = tracker.getJobInfo(max(jobs))
        stage = None if last is None or not last.stageIds else tracker.getStageInfo(max(last.stageIds))
        return None if stage is None else stage.numTasks
