"""Helpers shared by the producer benchmarks: topics, process stats, machine info.

The broker is aioprod's own embedded Tansu (``aioprod.embedded``), the one the CLI and the
tests start; nothing here imports from ``tests/``.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import re
import statistics
import subprocess
import time

from aioprod.embedded import EmbeddedBroker as Tansu
from aioprod.embedded import broker_binary

__all__ = ["Tansu"]

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def tansu_version() -> str:
    try:
        out = subprocess.run([broker_binary(), "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.strip() or "unknown"


def create_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 15.0) -> None:
    """Create ``topic`` and wait until every partition has a leader in the metadata."""
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=timeout).values():
        future.result(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        md = admin.list_topics(topic, timeout=timeout)
        info = md.topics.get(topic)
        if (
            info is not None
            and info.error is None
            and len(info.partitions) == partitions
            and all(p.leader >= 0 for p in info.partitions.values())
        ):
            return
        time.sleep(0.05)
    raise RuntimeError(f"topic {topic} did not get {partitions} partitions with leaders")


def read_topic(
    bootstrap: str, topic: str, partitions: int, timeout: float = 60.0
) -> dict[int, list[tuple[bytes | None, bytes | None]]]:
    """Every record the broker holds for ``topic``: each partition's ``(key, value)`` pairs in
    offset order, read back with an independent client.

    (Tansu 0.6.0's ListOffsets answers a high watermark below the real one after compressed
    produces, so the watermarks cannot be trusted; offsets read back are contiguous from 0.)
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-verify",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "log_level": 0,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        ends: dict[int, int] = {}
        stored: dict[int, list[tuple[bytes | None, bytes | None]]] = {p: [] for p in range(partitions)}
        deadline = time.monotonic() + timeout
        while len(ends) < partitions and time.monotonic() < deadline:
            for message in consumer.consume(100_000, timeout=1.0):
                error = message.error()
                if error is None:
                    stored[message.partition() or 0].append((message.key(), message.value()))
                elif error.code() == KafkaError._PARTITION_EOF:
                    ends[message.partition() or 0] = message.offset() or 0
                else:
                    raise RuntimeError(f"reading back {topic}: {error}")
        if len(ends) < partitions:
            raise RuntimeError(f"reading back {topic} took longer than {timeout}s")
        if any(len(stored[p]) != end for p, end in ends.items()):
            read = {p: len(records) for p, records in stored.items()}
            raise RuntimeError(f"{topic}: read {read} records per partition but the partitions end at {ends}")
        return stored
    finally:
        consumer.close()


def rss_bytes(pid: int | str = "self") -> int:
    """Current resident set size of a process."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE_SIZE


def peak_rss_bytes() -> int:
    """This process's peak resident set size (VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def system_busy_seconds() -> float:
    """CPU seconds all CPUs together have spent busy since boot (from /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def system_steal_seconds() -> float:
    """CPU seconds the hypervisor has stolen from all CPUs since boot (from /proc/stat)."""
    with open("/proc/stat") as f:
        return int(f.readline().split()[8]) / CLOCK_TICKS


def count_records(bootstrap: str, topic: str, timeout: float = 60.0) -> int:
    """Records in the topic as a consumer sees them, counted by reading them all (Tansu's end
    offsets count batches; transaction markers take offsets too)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-count",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "log_level": 0,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        pending, count = set(partitions), 0
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 0.5):
                if msg.error() is None:
                    count += 1
                elif msg.error().code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                else:
                    raise RuntimeError(f"consume error: {msg.error()}")
        return count
    finally:
        consumer.close()


def print_rates(results: dict[str, list[float]], unit: str, decimals: int = 0) -> None:
    """One line per method: the median and the best of its rates."""
    width = max(len(name) for name in results) + 2
    print(f"\n{'method':{width}} {unit + ' median':>18} {'best':>10}")
    for name, rates in results.items():
        print(f"{name:{width}} {statistics.median(rates):>18,.{decimals}f} {max(rates):>10,.{decimals}f}")


def package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_info() -> dict[str, str]:
    cpu = "unknown"
    mhz = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and cpu == "unknown":
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("cpu MHz") and not mhz:
                mhz = f" @ {float(line.split(':', 1)[1]):.0f} MHz"
    ram = "unknown"
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        match = re.search(r"MemTotal:\s+(\d+) kB", f.read())
        if match:
            ram = f"{int(match.group(1)) / 1024**2:.1f} GiB"
    info = {
        "cpus": str(os.cpu_count()),
        "cpu": cpu + mhz,
        "ram": ram,
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        # A yardstick for comparing machines: CPython speed on this box, right now.
        "sum(range(1000))": f"{python_speed_us():.1f} µs",
        "broker": f"{tansu_version()} (memory storage)",
    }
    try:
        import confluent_kafka

        info["librdkafka"] = confluent_kafka.libversion()[0]
    except ImportError:
        info["librdkafka"] = "not installed"
    for name in ("aioprod", "aiokafka", "confluent-kafka", "uvloop", "lz4"):
        info[name] = package_version(name)
    info["aioprod source"] = git_state()
    return info


def python_speed_us() -> float:
    """Best of 5 x 2,000 runs of ``sum(range(1000))``, in microseconds (a noisy-box yardstick)."""
    import timeit

    return min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000 * 1e6


def git_state() -> str:
    """The checkout's commit, and whether aioprod/ has uncommitted changes (benchmarked as they are)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "aioprod"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not commit:
        return "unknown"
    return f"git {commit}" + (" + uncommitted changes in aioprod/" if dirty else "")
