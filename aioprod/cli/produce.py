"""``aioprod produce``: one record per input line, like ``kcat -P``.

Input is read in chunks on a worker thread so that a slow or interactive stdin never
blocks the event loop (the producer's sender keeps running while we wait for input), and
each line is sent as soon as it arrives. Bytes pass through unchanged; failures are
reported per line number and make the exit code 1. A line is split into headers, key and
value the way kcat and Kafka's console producer do it (``-K``, ``-k``, ``--parse-headers``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import IO, Any

import click

from aioprod.cli.cluster import check_first, topic_problem, watch_topic
from aioprod.cli.common import (
    ClientOptions,
    CliError,
    CliUsageError,
    client_options,
    debug_option,
    describe,
    echo,
    open_producer,
    output_gone,
    parse_delimiter,
    parse_pairs,
    record_outcomes,
    run,
    topic_names,
    warn,
)
from aioprod.cli.stats import AckTracker
from aioprod.config import ProducerConfig
from aioprod.errors import KafkaError, RecordTooLargeError
from aioprod.producer.record_future import RecordMetadata

_CHUNK = 64 * 1024
_READ_AHEAD = 4  # chunks


async def read_chunks(stream: IO[bytes]) -> AsyncIterator[bytes]:
    """The stream's data as it arrives, read on a daemon thread.

    Not the loop's default executor: a read blocked on an idle terminal would keep
    asyncio's shutdown waiting after Ctrl-C. At most a few chunks are read ahead of what
    the producer has taken, so a fast file is not read far ahead. The thread hands chunks
    over with a plain callback, never a coroutine: input arriving after the loop closed
    (Ctrl-C, then the pipe closing) would have left one never awaited, and Python's warning
    about it after the command's last line.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | BaseException] = asyncio.Queue()
    room = threading.Semaphore(_READ_AHEAD)
    read: Callable[[], bytes]
    try:
        # The raw descriptor: a thread blocked in a buffered read holds the buffer's lock,
        # and the interpreter aborts at exit if it cannot take that lock.
        fd = stream.fileno()
        read = functools.partial(os.read, fd, _CHUNK)
    except (AttributeError, OSError, ValueError):  # an in-memory stream
        read = functools.partial(getattr(stream, "read1", stream.read), _CHUNK)

    def pump() -> None:
        while True:
            room.acquire()
            item: bytes | BaseException
            try:
                item = read()
            except Exception as exc:  # handed to the loop, raised there
                item = exc
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:
                return  # the loop is closed (interrupted): nobody is reading
            if not isinstance(item, bytes) or not item:
                return

    threading.Thread(target=pump, name="aioprod-input", daemon=True).start()
    while True:
        item = await queue.get()
        room.release()
        if isinstance(item, BaseException):
            raise item
        if not item:
            return
        yield item


@dataclass(frozen=True)
class OverlongRecord:
    """A record longer than ``read_records``' ``longest``, dropped as it was read."""

    size: int


async def read_records(
    stream: IO[bytes], delimiter: bytes, *, drop_cr: bool = False, longest: int | None = None
) -> AsyncIterator[bytes | OverlongRecord]:
    """The stream split at ``delimiter``; a last unterminated record counts.

    With ``drop_cr`` (the command's default delimiter: CRLF input) a trailing ``\\r`` is
    dropped too. Each byte is searched once, so a very long record costs linear time. A
    record longer than ``longest`` bytes comes as its size only, and is never held whole:
    a 300 MB line would otherwise be read into memory (twice) just to be refused as too
    large.
    """
    pending = bytearray()
    dropped = 0  # bytes of an overlong record let go of so far
    async for chunk in read_chunks(stream):
        scan_from = max(0, len(pending) - len(delimiter) + 1)  # a delimiter may straddle the chunks
        pending += chunk
        start = 0
        while (end := pending.find(delimiter, max(start, scan_from))) != -1:
            yield _record(pending, start, end, dropped, drop_cr, longest)
            dropped = 0
            start = end + len(delimiter)
        del pending[:start]
        if longest is not None and len(pending) > longest + len(delimiter):
            # Longer than `longest` even if it ends in a partial delimiter and a \r: keep
            # only what may be that \r and the start of the delimiter.
            let_go = len(pending) - len(delimiter)
            dropped += let_go
            del pending[:let_go]
    if pending or dropped:
        yield _record(pending, 0, len(pending), dropped, drop_cr, longest)


def _record(
    pending: bytearray, start: int, end: int, dropped: int, drop_cr: bool, longest: int | None
) -> bytes | OverlongRecord:
    """``pending[start:end]`` as a record, after ``dropped`` bytes of it already let go of."""
    size = dropped + end - start
    if drop_cr and end > start and pending[end - 1] == 0x0D:  # b"\r"
        size -= 1
        end -= 1
    if longest is not None and size > longest:
        return OverlongRecord(size)
    return bytes(pending[start:end])


Headers = list[tuple[str, bytes | None]]


@dataclass(frozen=True)
class LineFormat:
    """How a line becomes a record: ``[HEADERS <hdelim>] [KEY <sep>] VALUE``."""

    key_separator: bytes | None = None
    fixed_key: bytes | None = None
    empty_is_null: bool = False
    headers: tuple[tuple[str, bytes | None], ...] = ()
    headers_delimiter: bytes | None = None  # --parse-headers
    headers_separator: bytes = b","
    headers_key_separator: bytes = b":"

    def split(self, line: bytes) -> tuple[bytes | None, bytes | None, Headers]:
        """(key, value, headers) of one line, as kcat and kafka-console-producer read it."""
        headers: Headers = list(self.headers)
        if self.headers_delimiter is not None:
            head, sep, line = line.partition(self.headers_delimiter)
            if not sep:
                raise ValueError(f"no headers delimiter {self.headers_delimiter!r} in the line (--parse-headers)")
            headers += self._parse_headers(head)
        key: bytes | None = self.fixed_key
        value: bytes | None = line
        if self.key_separator is not None:
            head, sep, tail = line.partition(self.key_separator)
            if sep:  # as kcat: a line without the separator is a value (with the -k key, if any)
                key, value = head, tail
        if self.empty_is_null:
            key = key or None
            value = value or None
        return key, value, headers

    def longest_line(self, record_limit: int) -> int:
        """The longest line that may make a record of at most ``record_limit`` bytes.

        Every byte of a line reaches its record except the separators: the headers
        delimiter and key separator once each, and the header separators, which a parsed
        header pays back with at least two length bytes of its own (an item that is just the
        key separator: ``len(hks) + len(hsep)`` bytes of line, two in the record).
        """
        shrink = 1.0
        if self.headers_delimiter is not None:
            shrink = max(shrink, (len(self.headers_separator) + len(self.headers_key_separator)) / 2)
        once = len(self.headers_delimiter or b"") + len(self.key_separator or b"")
        return int(record_limit * shrink) + once

    def _parse_headers(self, text: bytes) -> Headers:
        out: Headers = []
        for item in text.split(self.headers_separator) if text else []:
            name, sep, value = item.partition(self.headers_key_separator)
            try:
                out.append((name.decode(), value if sep else None))  # no separator: a null value
            except UnicodeDecodeError:
                raise ValueError(f"header name {name!r} is not UTF-8") from None
        return out


class FailedLines:
    """The "line N: error" lines on stderr, where lines failing one after another with the same
    error are said once: a broker gone for good, or a second Ctrl-C, fails thousands of lines
    alike. The first is said at once, the rest when the run ends (another outcome, or the end)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say
        self._error = ""
        self._first = self._last = self._count = 0  # the run after its first line: lowest, highest, how many

    def fail(self, line_number: int, error: str) -> None:
        if error == self._error:  # (partitions answer in their own order: the lines may come in any)
            if not self._count:
                self._first = self._last = line_number
            self._first = min(self._first, line_number)
            self._last = max(self._last, line_number)
            self._count += 1
            return
        self.end_run()
        self._say(f"line {line_number}: {error}")
        self._error = error

    def end_run(self) -> None:
        count, self._count, error, self._error = self._count, 0, self._error, ""
        if count == 1:
            self._say(f"line {self._last}: {error}")
        elif count == self._last - self._first + 1:
            self._say(f"lines {self._first}-{self._last}: the same")
        elif count:
            self._say(f"{count:,} more lines from {self._first} to {self._last}: the same")


def report_line(line_number: int, metadata: RecordMetadata | None, error: BaseException | None) -> str:
    """One JSON delivery report (``--report``)."""
    if metadata is None:
        return json.dumps({"line": line_number, "error": describe(error)})
    return json.dumps(
        {
            "line": line_number,
            "topic": metadata.topic,
            "partition": metadata.partition,
            "offset": metadata.offset,
            "timestamp": metadata.timestamp,
        }
    )


async def produce_lines(
    options: dict[str, Any],
    topic: str,
    stream: IO[bytes],
    delimiter: bytes,
    line_format: LineFormat,
    partition: int | None,
    tracker: AckTracker,
    drop_cr: bool = False,
) -> None:
    """Send every line; failures are reported as they happen, on stderr (and stdout with --report)."""
    check = watch_topic(options, topic)
    stopped: KafkaError | None = None
    line_number = 0
    try:
        async with open_producer(options, tracker) as producer:
            try:
                await check_first(check, producer, topic)
            except KafkaError as exc:
                raise CliError(f"{describe(exc)}{topic_problem(check)}") from exc
            limit_name, record_limit = _record_limit(producer.config)
            longest = line_format.longest_line(record_limit)
            async for line in read_records(stream, delimiter, drop_cr=drop_cr, longest=longest):
                line_number += 1
                if isinstance(line, OverlongRecord):
                    too_large = (
                        f"a line of {line.size:,} bytes makes a record larger than {limit_name} "
                        f"({record_limit:,}) allows"
                    )
                    tracker.fail(RecordTooLargeError(too_large), line_number)
                    continue
                try:
                    key, value, headers = line_format.split(line)
                except ValueError as exc:
                    tracker.fail(exc, line_number)
                    continue
                sent_at = time.perf_counter()
                try:
                    future = await producer.send(topic, value, key, partition=partition, headers=headers)
                except (TypeError, ValueError) as exc:  # this record is wrong (too large, no such partition)
                    info = producer.cluster().topics.get(topic)
                    if partition is not None and info is not None and partition not in info.partitions:
                        # -p is wrong for every line, not this one: one usage error, not one per line.
                        raise CliUsageError(f"--partition {partition}: {exc}") from exc
                    tracker.fail(exc, line_number)
                    continue
                except KafkaError as exc:  # the cluster is: every later line would wait max.block.ms too
                    stopped = exc
                    break
                tracker.track(future, sent_at, line_number)
            await tracker.wait()  # the lines already sent get their outcome (and their "line N:" failures)
    finally:
        check.cancel()
    if stopped is not None:
        raise CliError(
            f"stopped at line {line_number}: {describe(stopped)}{topic_problem(check)}; "
            f"lines before it: {tracker.counts()}"
        ) from stopped


def _record_limit(config: ProducerConfig) -> tuple[str, int]:
    """The option that bounds a record's size, and its value: the smaller of the two."""
    return min(
        ("max_request_size", config.max_request_size), ("buffer_memory", config.buffer_memory), key=lambda o: o[1]
    )


def _topic_and_input(topic: str | None, given: str | None, input_file: IO[bytes]) -> tuple[str, IO[bytes]]:
    """TOPIC as the first argument, or -t/--topic as kcat and kafka-console-producer spell it
    (then the one argument left, if any, is FILE)."""
    ctx = click.get_current_context()
    params = {p.name: p for p in ctx.command.params}
    if given is None:
        if topic is None:
            raise click.UsageError("no topic: aioprod produce TOPIC [FILE], or -t TOPIC")
        # Checked here, not by the argument's callback: with -t, the argument is a file name.
        try:
            return topic_names(ctx, params["topic"], topic), input_file
        except click.BadParameter as exc:
            exc.param = params["topic"]
            raise
    if topic is None:
        return given, input_file
    if ctx.get_parameter_source("input_file") is not click.core.ParameterSource.DEFAULT:
        raise click.UsageError(f"two topics: {topic!r} and -t {given!r}")
    return given, click.File("rb").convert(topic, params["input_file"], ctx)  # the argument is FILE


@click.command(short_help="Produce one record per input line, like kcat -P.")
@click.argument("topic", required=False)
@click.argument("input_file", metavar="[FILE|-]", type=click.File("rb"), default="-")
@click.option("-t", "--topic", "topic_option", metavar="TOPIC", callback=topic_names, help="The topic, as kcat -t.")
@client_options
@click.option("-K", "--key-separator", metavar="SEP", help="Split each line into KEY SEP VALUE (first SEP).")
@click.option(
    "-k", "--key", "fixed_key", metavar="KEY", help="The key of every record (a line split by -K keeps its own)."
)
@click.option(
    "-D", "--delimiter", metavar="DELIM", show_default="\\n (and a trailing \\r dropped)", help="Record delimiter."
)
@click.option("-Z", "--null-empty", is_flag=True, help="Send an empty key or value as null (kcat -Z).")
@click.option("-H", "--header", "headers", metavar="KEY=VALUE", multiple=True, help="Add a header to every record.")
@click.option(
    "--parse-headers",
    is_flag=True,
    help="Each line starts with headers: K1:V1,K2:V2<TAB>rest (as kafka-console-producer parse.headers).",
)
@click.option("--headers-delimiter", metavar="DELIM", default="\\t", show_default=True, help="Ends the headers.")
@click.option("--headers-separator", metavar="SEP", default=",", show_default=True, help="Between headers.")
@click.option(
    "--headers-key-separator", metavar="SEP", default=":", show_default=True, help="Between a header's key and value."
)
@click.option("-p", "--partition", type=click.IntRange(min=0), help="Send every record to this partition.")
@click.option("--report", is_flag=True, help="Print a JSON delivery report line per record on stdout.")
@debug_option
def produce(
    topic: str | None,
    input_file: IO[bytes],
    topic_option: str | None,
    client: ClientOptions,
    key_separator: str | None,
    fixed_key: str | None,
    delimiter: str | None,
    null_empty: bool,
    headers: tuple[str, ...],
    parse_headers: bool,
    headers_delimiter: str,
    headers_separator: str,
    headers_key_separator: str,
    partition: int | None,
    report: bool,
) -> None:
    """Produce one record per line of FILE (default: standard input), like kcat -P.

    Lines end with \\n (a trailing \\r is dropped too), or with -D DELIM; an empty line is
    an empty record (null with -Z). With -K, the text before the first SEP is the key
    and the rest the value; a line without SEP has no key, or the -k key. Without -p,
    records with keys go where the Java client puts them (murmur2), keyless ones are
    spread by the sticky partitioner. Delimiters and separators take \\n \\r \\t \\0
    \\xNN escapes, as kcat's.

    A line that fails is reported as "line N: error" on stderr and the others still go;
    the exit code is then 1. --report prints one JSON line per record on stdout:
    {"line": N, "partition": P, "offset": O, ...} or {"line": N, "error": "..."}.

    \b
    Examples:
      echo hello | aioprod produce greetings -b localhost:9092
      echo hello | aioprod produce -t greetings -b localhost:9092      # as kcat -t
      aioprod produce orders -b localhost:9092 -K : orders.txt      # lines "key:value"
      aioprod produce events -b localhost:9092 -H source=cli -p 0 -X acks=1 --report events.jsonl
      printf 'trace:abc\\tk1:v1\\n' | aioprod produce t -b localhost:9092 --parse-headers -K :
      aioprod produce t -F client.properties -D '\\0' -Z records.bin
    """
    topic, input_file = _topic_and_input(topic, topic_option, input_file)
    servers = client.require_bootstrap()
    options = client.producer_options(servers)
    line_format = LineFormat(
        key_separator=parse_delimiter(key_separator, "--key-separator") if key_separator is not None else None,
        fixed_key=os.fsencode(fixed_key) if fixed_key is not None else None,  # argv bytes as given
        empty_is_null=null_empty,
        headers=tuple((k, os.fsencode(v)) for k, v in parse_pairs(headers, "--header")),
        headers_delimiter=parse_delimiter(headers_delimiter, "--headers-delimiter") if parse_headers else None,
        headers_separator=parse_delimiter(headers_separator, "--headers-separator"),
        headers_key_separator=parse_delimiter(headers_key_separator, "--headers-key-separator"),
    )
    record_delimiter = parse_delimiter(delimiter, "--delimiter") if delimiter is not None else b"\n"

    reporting = report

    def emit(text: str) -> None:
        nonlocal reporting
        try:
            click.echo(text)
        except BrokenPipeError:
            # The reader went away (`... --report | head`): stop reporting, keep producing.
            reporting = False
            output_gone()  # no error at exit's flush
            warn("standard output closed: no more delivery reports")

    failures = FailedLines(lambda text: echo(text, err=True))

    def on_ack(metadata: RecordMetadata, line_number: int) -> None:
        failures.end_run()
        if reporting:
            emit(report_line(line_number, metadata, None))

    def on_error(exc: BaseException, line_number: int) -> None:
        failures.fail(line_number, describe(exc))
        if reporting:
            emit(report_line(line_number, None, exc))

    tracker = AckTracker(on_ack=on_ack, on_error=on_error)
    record_outcomes(tracker)
    try:
        run(
            produce_lines(
                options, topic, input_file, record_delimiter, line_format, partition, tracker, delimiter is None
            )
        )
    finally:
        failures.end_run()  # before the summary, or Ctrl-C's
    summary = f"{tracker.acked:,} record{'' if tracker.acked == 1 else 's'} produced to {topic!r}"
    if tracker.failed or tracker.unsent:
        failed = f"{tracker.failed:,} failed (lines above)" if tracker.failed else ""
        unsent = f"{tracker.unsent:,} not sent (the producer closed first)" if tracker.unsent else ""
        raise CliError(f"{summary}; {', '.join(filter(None, (failed, unsent)))}")
    echo(f"aioprod: {summary}", err=True)
