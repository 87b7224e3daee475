"""``aioprod produce``: one record per input line, like ``kcat -P``.

Input is read in chunks on a worker thread so that a slow or interactive stdin never
blocks the event loop (the producer's sender keeps running while we wait for input), and
each line is sent as soon as it arrives. Bytes pass through unchanged; failures are
reported per line number and make the exit code 1.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import IO, Any

import click

from aioprod.cli.common import (
    CliError,
    CliUsageError,
    bootstrap_option,
    config_option,
    debug_option,
    describe,
    parse_pairs,
    producer_options,
    require_bootstrap,
    run,
)
from aioprod.cli.stats import AckTracker
from aioprod.errors import KafkaError
from aioprod.producer.producer import Producer

_CHUNK = 64 * 1024


async def read_chunks(stream: IO[bytes]) -> AsyncIterator[bytes]:
    """The stream's data as it arrives, read on a daemon thread.

    Not the loop's default executor: a read blocked on an idle terminal would keep
    asyncio's shutdown waiting after Ctrl-C. The small queue keeps a fast file from
    being read far ahead of what the producer has taken.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | BaseException] = asyncio.Queue(maxsize=4)
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
            item: bytes | BaseException
            try:
                item = read()
            except Exception as exc:  # handed to the loop, raised there
                item = exc
            try:
                asyncio.run_coroutine_threadsafe(queue.put(item), loop).result()
            except (RuntimeError, concurrent.futures.CancelledError):
                return  # the loop is gone (interrupted): nobody is reading
            if not isinstance(item, bytes) or not item:
                return

    threading.Thread(target=pump, name="aioprod-input", daemon=True).start()
    while True:
        item = await queue.get()
        if isinstance(item, BaseException):
            raise item
        if not item:
            return
        yield item


async def read_lines(stream: IO[bytes]) -> AsyncIterator[bytes]:
    """The stream's lines without their ``\\n`` (or ``\\r\\n``); a last unterminated line counts."""
    pending = b""
    async for chunk in read_chunks(stream):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.removesuffix(b"\r")
    if pending:
        yield pending.removesuffix(b"\r")


async def produce_lines(
    options: dict[str, Any],
    topic: str,
    stream: IO[bytes],
    key_separator: bytes | None,
    headers: list[tuple[str, bytes | None]],
    partition: int | None,
) -> tuple[int, int]:
    """Send every line; (records acked, records failed). Failures are reported as they happen."""

    def report(exc: BaseException, line_number: int) -> None:
        click.echo(f"line {line_number}: {describe(exc)}", err=True)

    tracker = AckTracker(on_error=report)
    async with Producer(options) as producer:
        line_number = 0
        async for line in read_lines(stream):
            line_number += 1
            key: bytes | None = None
            value = line
            if key_separator is not None:
                head, sep, tail = line.partition(key_separator)
                if sep:  # as kcat: a line without the separator is a value with no key
                    key, value = head, tail
            sent_at = time.perf_counter()
            try:
                future = await producer.send(topic, value, key, partition=partition, headers=headers)
            except (TypeError, ValueError) as exc:  # this record is wrong (too large, no such partition)
                tracker.fail(exc, line_number)
                continue
            except KafkaError as exc:  # the cluster is: every later line would wait max.block.ms too
                raise CliError(f"stopped at line {line_number}: {describe(exc)}") from exc
            tracker.track(future, sent_at, line_number)
        await tracker.wait()
    return tracker.acked, tracker.failed


@click.command(short_help="Produce one record per input line, like kcat -P.")
@click.argument("topic")
@click.argument("input_file", metavar="[FILE|-]", type=click.File("rb"), default="-")
@bootstrap_option
@click.option("-K", "--key-separator", metavar="SEP", help="Split each line into KEY SEP VALUE (first SEP).")
@click.option("-H", "--header", "headers", metavar="KEY=VALUE", multiple=True, help="Add a header to every record.")
@click.option("-p", "--partition", type=click.IntRange(min=0), help="Send every record to this partition.")
@config_option
@debug_option
def produce(
    topic: str,
    input_file: IO[bytes],
    bootstrap: str | None,
    key_separator: str | None,
    headers: tuple[str, ...],
    partition: int | None,
    overrides: tuple[str, ...],
) -> None:
    """Produce one record per line of FILE (default: standard input), like kcat -P.

    Lines end with \\n (a trailing \\r is dropped too); an empty line is an empty record.
    With -K, the text before the first SEP is the key and the rest the value; a line
    without SEP has no key. Without -p, records with keys go where the Java client puts
    them (murmur2), keyless ones are spread by the sticky partitioner.

    A line that fails is reported as "line N: error" on stderr and the others still go;
    the exit code is then 1.

    \b
    Examples:
      echo hello | aioprod produce greetings -b localhost:9092
      aioprod produce orders -b localhost:9092 -K : orders.txt      # lines "key:value"
      aioprod produce events -H source=cli -H v=2 -p 0 -X acks=1 events.jsonl
    """
    servers = require_bootstrap(bootstrap, overrides)
    options = producer_options(servers, overrides)
    if key_separator == "":
        raise CliUsageError("--key-separator must not be empty")
    header_list: list[tuple[str, bytes | None]] = [(k, v.encode()) for k, v in parse_pairs(headers, "--header")]
    separator = key_separator.encode() if key_separator is not None else None
    acked, failed = run(produce_lines(options, topic, input_file, separator, header_list, partition))
    summary = f"{acked:,} record{'' if acked == 1 else 's'} produced to {topic!r}"
    if failed:
        raise CliError(f"{summary}; {failed:,} failed (lines above)")
    click.echo(f"aioprod: {summary}", err=True)
