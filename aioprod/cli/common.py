"""What the commands share: options, one-line errors, exit codes, the event loop, the broker.

Exit codes (also in ``docs/cli.md`` and ``aioprod --help``):

- 0: success
- 1: the command ran and failed (records failed, a check failed, a broker or connection error)
- 2: usage error (unknown flag, bad ``-X key=value``, missing bootstrap servers)
- 130: interrupted (Ctrl-C)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any, TypeVar

import click
from rich.console import Console

from aioprod.config import ProducerConfig
from aioprod.embedded import EmbeddedBroker, EmbeddedBrokerError
from aioprod.errors import ConfigError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

BOOTSTRAP_ENV = "AIOPROD_BOOTSTRAP_SERVERS"
DEBUG_META = "aioprod.debug"

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class CliError(click.ClickException):
    """An expected failure: printed as one ``aioprod: error: ...`` line, no usage text."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))

    def show(self, file: Any = None) -> None:
        click.echo(f"aioprod: error: {self.format_message()}", err=True)


class CliUsageError(CliError):
    """A usage mistake (bad ``-X``, no bootstrap servers): one line, exit code 2."""

    exit_code = EXIT_USAGE


def one_line(text: str) -> str:
    """Collapse a message onto one line, so every error is one readable line."""
    return " ".join(text.split())


def describe(exc: BaseException | None) -> str:
    """``TypeName: message`` on one line; the type says a lot for Kafka errors."""
    if exc is None:
        return "unknown error"
    message = str(exc)
    return one_line(f"{type(exc).__name__}: {message}" if message else type(exc).__name__)


# -- options --------------------------------------------------------------------------------


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[DEBUG_META] = True


def debug_option(f: F) -> F:
    """``--debug``: on a failure, print the traceback too (accepted before or after the command)."""
    option = click.option(
        "--debug",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        envvar="AIOPROD_DEBUG",
        callback=_set_debug,
        help="On failure, also print the Python traceback.",
    )
    return option(f)


def bootstrap_option(f: F) -> F:
    return click.option(
        "-b",
        "--bootstrap-servers",
        "bootstrap",
        metavar="HOST:PORT[,...]",
        envvar=BOOTSTRAP_ENV,
        show_envvar=True,
        help="Brokers to bootstrap from.",
    )(f)


def config_option(f: F) -> F:
    return click.option(
        "-X",
        "overrides",
        metavar="KEY=VALUE",
        multiple=True,
        help="A producer option, Java/librdkafka name (e.g. -X linger.ms=5 -X acks=1). Repeatable.",
    )(f)


def parse_pairs(values: tuple[str, ...], flag: str) -> list[tuple[str, str]]:
    """``key=value`` strings → pairs; a malformed one is a usage error naming it."""
    pairs = []
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CliUsageError(f"{flag} {item!r}: expected KEY=VALUE")
        pairs.append((key.strip(), value))
    return pairs


def _snake(key: str) -> str:
    return key.strip().replace(".", "_").replace("-", "_").lower()


def _is_bootstrap_key(key: str) -> bool:
    return _snake(key) in ("bootstrap_servers", "metadata_broker_list")


def overrides_option(overrides: tuple[str, ...], name: str) -> bool:
    """Whether ``-X`` sets the option ``name`` (snake_case), in any spelling."""
    return any(_snake(key) == name for key, _ in parse_pairs(overrides, "-X"))


def resolve_bootstrap(bootstrap: str | None, overrides: tuple[str, ...]) -> str | None:
    """The bootstrap servers from ``-b``/``$AIOPROD_BOOTSTRAP_SERVERS`` or ``-X bootstrap.servers``."""
    from_x = [value for key, value in parse_pairs(overrides, "-X") if _is_bootstrap_key(key)]
    if from_x and bootstrap:
        raise CliUsageError(f"bootstrap servers given twice: -b/{BOOTSTRAP_ENV} and -X bootstrap.servers")
    return from_x[-1] if from_x else (bootstrap or None)


def require_bootstrap(bootstrap: str | None, overrides: tuple[str, ...]) -> str:
    servers = resolve_bootstrap(bootstrap, overrides)
    if not servers:
        raise CliUsageError(f"no bootstrap servers: pass -b HOST:PORT or set {BOOTSTRAP_ENV}")
    return servers


def producer_options(bootstrap: str, overrides: tuple[str, ...], **defaults: Any) -> dict[str, Any]:
    """The options for :class:`~aioprod.Producer`, validated now so a typo is a usage error.

    ``defaults`` are the command's own choices; ``-X`` overrides them.
    """
    options: dict[str, Any] = {}
    for key, value in [*defaults.items(), *parse_pairs(overrides, "-X")]:
        if not _is_bootstrap_key(key):
            options[key] = value
    options = _dedupe(options)
    options["bootstrap_servers"] = bootstrap
    try:
        ProducerConfig.from_options(options)
    except ConfigError as exc:
        raise CliUsageError(f"bad producer option: {exc}") from exc
    return options


def _dedupe(options: Mapping[str, Any]) -> dict[str, Any]:
    """Later spellings of one option win (``-X linger.ms=1`` over a default ``linger_ms``)."""
    by_name: dict[str, tuple[str, Any]] = {}
    for key, value in options.items():
        by_name[_snake(key)] = (key, value)
    return dict(by_name.values())


# -- running --------------------------------------------------------------------------------


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run the command's coroutine on uvloop when it is installed (faster I/O), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        result: T = runner.run(main)
        return result


def console(*, stderr: bool = False) -> Console:
    """A rich console; wide when not a terminal so piped tables do not wrap."""
    out = Console(stderr=stderr, highlight=False)
    if not out.is_terminal:
        out.width = max(out.width, 160)
    return out


@contextlib.contextmanager
def cluster_or_embedded(bootstrap: str | None) -> Iterator[tuple[str, EmbeddedBroker | None]]:
    """The given cluster, or an embedded broker for the command's lifetime when none is given."""
    if bootstrap:
        yield bootstrap, None
        return
    try:
        broker = EmbeddedBroker().start()
    except EmbeddedBrokerError as exc:
        raise CliError(str(exc)) from exc
    try:
        yield broker.bootstrap, broker
    finally:
        broker.stop()


def embedded_hint(broker: EmbeddedBroker | None) -> str:
    """When the embedded broker died, that is the real story of a failure: say so."""
    if broker is None or broker.running:
        return ""
    return f" ({broker.failure()})"
