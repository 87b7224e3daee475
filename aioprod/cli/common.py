"""What the commands share: options, one-line errors, exit codes, logging, the event loop, output.

Exit codes (also in ``docs/cli.md`` and ``aioprod --help``):

- 0: success
- 1: the command ran and failed (records failed, a check failed, a broker or connection error)
- 2: usage error (unknown flag, bad ``-X key=value``, missing bootstrap servers)
- 130: interrupted (Ctrl-C)

Producer options come from, lowest precedence first: the command's own defaults, a Java
``.properties`` file (``-F``), ``AIOPROD_<OPTION>`` environment variables, then ``-X``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import importlib.metadata
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import click
from rich import box
from rich.console import Console
from rich.table import Table

from aioprod.cli.properties import PropertiesError, load_properties, names_secret
from aioprod.cli.stats import AckTracker
from aioprod.config import ProducerConfig, check_option, snake_name
from aioprod.embedded import EmbeddedBroker, EmbeddedBrokerError
from aioprod.errors import ConfigError, UnsupportedOptionError
from aioprod.producer.producer import Producer, check_topic_name

#: Signals that stop a command as Ctrl-C does: SIGTERM (kill, timeout, CI), and SIGHUP (the
#: terminal window closed, an ssh session dropped), which the JVM's console producer also
#: answers with its shutdown hook -- unless SIGHUP was ignored when the process started
#: (``nohup``), which the JVM respects too (it installs no handler for an ignored signal).
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM) + (
    (signal.SIGHUP,) if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) != signal.SIG_IGN else ()
)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

BOOTSTRAP_ENV = "AIOPROD_BOOTSTRAP_SERVERS"
CONFIG_FILE_ENV = "AIOPROD_CONFIG_FILE"
ENV_PREFIX = "AIOPROD_"
#: AIOPROD_* variables that are not producer options (AIOPROD_TEST_* are the test suite's).
_OTHER_ENV = {"bootstrap_servers", "config_file", "debug", "pure_python", "require_speedups", "kafka_protocol_dir"}
DEBUG_META = "aioprod.debug"
VERBOSITY_META = "aioprod.verbosity"
OUTCOMES_META = "aioprod.outcomes"
DEFAULT_DOCS_URL = "https://aioprod.readthedocs.io/"

log = logging.getLogger(__name__)

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class CliError(click.ClickException):
    """An expected failure: printed as one ``aioprod: error: ...`` line, no usage text."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))

    def show(self, file: Any = None) -> None:
        echo(f"aioprod: error: {self.format_message()}", err=True)


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


def warn(message: str) -> None:
    """One ``aioprod: warning: ...`` line on stderr."""
    echo(f"aioprod: warning: {one_line(message)}", err=True)


def docs_url(page: str = "") -> str:
    """The documentation site (the package metadata's Documentation URL), or one page of it."""
    try:
        urls = importlib.metadata.metadata("aioprod").get_all("Project-URL") or []
    except importlib.metadata.PackageNotFoundError:  # running from a source tree without metadata
        urls = []
    base = next((url.split(",", 1)[1].strip() for url in urls if url.startswith("Documentation,")), DEFAULT_DOCS_URL)
    return base.rstrip("/") + "/" + page


# -- options --------------------------------------------------------------------------------


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[DEBUG_META] = True


def _add_verbosity(ctx: click.Context, _param: click.Parameter, value: int) -> None:
    ctx.meta[VERBOSITY_META] = ctx.meta.get(VERBOSITY_META, 0) + value
    log_to_stderr(ctx.meta[VERBOSITY_META])


def debug_option(f: F) -> F:
    """``--debug`` (a traceback on failure) and ``-v/-vv`` (logging), before or after the command."""
    debug = click.option(
        "--debug",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        envvar="AIOPROD_DEBUG",
        callback=_set_debug,
        help="On failure, also print the Python traceback.",
    )
    verbose = click.option(
        "-v",
        "--verbose",
        count=True,
        expose_value=False,
        is_eager=True,
        callback=_add_verbosity,
        help="Log what the producer does on stderr: -v for INFO, -vv for DEBUG (WARNING always).",
    )
    return verbose(debug(f))


@dataclass(frozen=True)
class ClientOptions:
    """Where a command's producer options come from: -b, -F and -X (and the environment)."""

    bootstrap: str | None
    config_file: Path | None
    overrides: tuple[str, ...]

    def sources(self) -> list[tuple[str, str, str]]:
        """``(key, value, where)`` from the file, the environment, then ``-X``: later ones win."""
        found: list[tuple[str, str, str]] = []
        if self.config_file is not None:
            try:
                pairs = load_properties(self.config_file)
            except PropertiesError as exc:
                raise CliUsageError(str(exc)) from exc
            found += [(key, value, f"{self.config_file}:{line}") for key, value, line in pairs]
        for name in ENV_OPTIONS:
            variable = ENV_PREFIX + name.upper()
            if variable in os.environ and name != "bootstrap_servers":  # that one is -b's variable
                found.append((name, os.environ[variable], f"${variable}"))
        found += [(key, value, f"-X {key}") for key, value in parse_pairs(self.overrides, "-X")]
        return found

    def resolve_bootstrap(self) -> str | None:
        """``-b``/``$AIOPROD_BOOTSTRAP_SERVERS`` or ``-X bootstrap.servers``, else the file's."""
        pairs = self.sources()
        from_x = [value for key, value, where in pairs if where.startswith("-X") and _is_bootstrap_key(key)]
        if from_x and self.bootstrap:
            raise CliUsageError(f"bootstrap servers given twice: -b/{BOOTSTRAP_ENV} and -X bootstrap.servers")
        if from_x or self.bootstrap:
            return from_x[-1] if from_x else self.bootstrap
        from_file = [value for key, value, _ in pairs if _is_bootstrap_key(key)]
        return from_file[-1] if from_file else None

    def require_bootstrap(self) -> str:
        servers = self.resolve_bootstrap()
        if not servers:
            raise CliUsageError(f"no bootstrap servers: pass -b HOST:PORT or set {BOOTSTRAP_ENV}")
        return servers

    def sets(self, name: str) -> bool:
        """Whether the file, the environment or ``-X`` sets the option ``name`` (snake_case)."""
        return any(snake_name(key) == name for key, _, _ in self.sources())

    def producer_options(self, bootstrap: str, **defaults: Any) -> dict[str, Any]:
        """The options for :class:`~aioprod.Producer`, validated now so a typo is a usage error.

        ``defaults`` are the command's own choices; the file, the environment and ``-X``
        override them, in that order. A bad option names where it came from.
        """
        options: dict[str, Any] = {check_option(key, value): value for key, value in defaults.items()}
        origin: dict[str, str] = {}
        for variable in sorted(os.environ):
            if not variable.startswith(ENV_PREFIX):
                continue
            # A typo, or another client's name for an option, was ignored without a word.
            suffix = variable[len(ENV_PREFIX) :]
            name = suffix.lower()
            # Read as AIOPROD_<NAME> in upper case only: AIOPROD_linger_ms is ignored, so said.
            known = suffix.isupper() and (name in ENV_OPTIONS or name in _OTHER_ENV or name.startswith("test_"))
            if not known:
                warn(
                    f"${variable} is not an option aioprod reads (AIOPROD_<NAME> takes the snake_case "
                    "names of docs/configuration.md): ignored"
                )
        for key, value, where in self.sources():
            if _is_bootstrap_key(key):
                continue
            try:
                name = check_option(key, value)
            except UnsupportedOptionError as exc:
                if where.startswith("-X"):
                    raise CliUsageError(f"bad producer option ({where}): {exc}") from exc
                warn(f"{where}: skipped: {exc}")  # a file written for the Java client, say
                continue
            except ConfigError as exc:
                raise CliUsageError(f"bad producer option ({where}): {exc}") from exc
            options[name] = value
            origin[name] = where
            log.info("option %s=%s (%s)", name, _shown(name, value), where)
        if options.get("transactional_id") is not None:
            raise CliUsageError("transactional.id is not supported here: the commands do not run transactions")
        merged = dict(options)
        merged["bootstrap_servers"] = bootstrap
        # Validated here, built again by Producer: what the config logs (idempotence turned
        # off, delivery_timeout_ms raised) is said once, by the producer's own.
        try:
            config = quiet_config(merged)
        except ConfigError as exc:
            # A value out of range, or options that conflict: say where the ones named came from.
            named = [
                where
                for name, where in origin.items()
                if re.search(rf"\b({name}|{re.escape(name.replace('_', '.'))})\b", str(exc))
            ]
            where = f" ({', '.join(named)})" if named else ""
            raise CliUsageError(f"bad producer option{where}: {exc}") from exc
        if log.isEnabledFor(logging.DEBUG):
            shown = (f"{f.name}={_shown(f.name, getattr(config, f.name))}" for f in dataclasses.fields(config))
            log.debug("producer options: %s", ", ".join(shown))
        return merged


@contextlib.contextmanager
def _config_unsaid(unsaid: bool = True) -> Iterator[None]:
    """Without the configuration's log lines (idempotence turned off, delivery_timeout_ms
    raised): the commands build the config to check it, and a probe producer before the
    command's own; the command's producer says them, once."""
    config_log = logging.getLogger("aioprod.config")
    was_disabled, config_log.disabled = config_log.disabled, config_log.disabled or unsaid
    try:
        yield
    finally:
        config_log.disabled = was_disabled


def quiet_config(options: Mapping[str, Any]) -> ProducerConfig:
    """``ProducerConfig.from_options``, its log lines left to the producer's own build."""
    with _config_unsaid():
        return ProducerConfig.from_options(options)


def _shown(key: str, value: Any) -> str:
    """A value fit for a log line: secrets are never printed."""
    return "<hidden>" if names_secret(key) and value else str(value)


#: Options settable as ``AIOPROD_<NAME>``: every configuration field a string can express
#: (not the callables and objects only Python code can pass, like serializers or an SSLContext).
ENV_OPTIONS = tuple(
    f.name
    for f in dataclasses.fields(ProducerConfig)
    if f.init and re.search(r"\b(str|int|bool|Secret)\b", str(f.type))
) + tuple(f"compression_{codec}_level" for codec in ("gzip", "lz4", "zstd"))  # Java's (KIP-390)


def client_options(f: F) -> F:
    """``-b``, ``-F`` and ``-X``, handed to the command as one ``client: ClientOptions``."""

    @functools.wraps(f)
    def command(
        *args: Any, bootstrap: str | None, config_file: Path | None, overrides: tuple[str, ...], **kw: Any
    ) -> Any:
        return f(*args, client=ClientOptions(bootstrap, config_file, overrides), **kw)

    options = [
        click.option(
            "-b",
            "--bootstrap-servers",
            "bootstrap",
            metavar="HOST:PORT[,...]",
            envvar=BOOTSTRAP_ENV,
            show_envvar=True,
            help="Brokers to bootstrap from.",
        ),
        click.option(
            "-F",
            "--config-file",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            envvar=CONFIG_FILE_ENV,
            show_envvar=True,
            help="Producer options from a Java .properties file (as kcat -F, or the Kafka tools' --producer.config).",
        ),
        click.option(
            "-X",
            "overrides",
            metavar="KEY=VALUE",
            multiple=True,
            help="A producer option, Java/librdkafka name (e.g. -X linger.ms=5 -X acks=1). Repeatable; "
            "also AIOPROD_<NAME> in the environment (AIOPROD_LINGER_MS=5).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command  # type: ignore[return-value]


def parse_pairs(values: tuple[str, ...], flag: str) -> list[tuple[str, str]]:
    """``key=value`` strings → pairs; a malformed one is a usage error naming it."""
    pairs = []
    for item in values:
        key, sep, value = item.partition("=")
        secret = names_secret(item)
        # 'sasl.password:abc==' or 'sasl.password abc==': the first '=' is the secret's own.
        if not sep or not key.strip() or (secret and re.search(r"[\s:]", key.strip())):
            shown = repr(item)
            if secret:
                # 'sasl.password:x' or 'sasl.password x' (.properties separators): never echo x.
                shown = repr(re.split(r"[\s:]", item.strip(), maxsplit=1)[0]) + " (value hidden)"
            raise CliUsageError(f"{flag} {shown}: expected KEY=VALUE")
        pairs.append((key.strip(), value))
    return pairs


def _is_bootstrap_key(key: str) -> bool:
    return snake_name(key) in ("bootstrap_servers", "metadata_broker_list")


def parse_delimiter(text: str, flag: str) -> bytes:
    """A delimiter as kcat takes it: ``\\n \\r \\t \\0 \\\\`` and ``\\xNN`` escapes, else UTF-8 text."""
    out = bytearray()
    index = 0
    simple = {"n": b"\n", "r": b"\r", "t": b"\t", "0": b"\0", "\\": b"\\"}
    while index < len(text):
        char = text[index]
        if char == "\\" and index + 1 < len(text):
            escaped = text[index + 1]
            if escaped in simple:
                out += simple[escaped]
                index += 2
                continue
            if escaped == "x":
                digits = text[index + 2 : index + 4]
                try:
                    out.append(int(digits, 16))
                except ValueError:
                    raise CliUsageError(f"{flag} {text!r}: \\x needs two hex digits") from None
                index += 4
                continue
        out += os.fsencode(char)  # bytes given on the command line that are not UTF-8 stay as given
        index += 1
    if not out:
        raise CliUsageError(f"{flag} must not be empty")
    return bytes(out)


# -- running --------------------------------------------------------------------------------


class _StderrHandler(logging.Handler):
    """Log records as ``aioprod: warning: ...`` lines (with time and logger when verbose)."""

    def __init__(self, verbosity: int) -> None:
        super().__init__()
        self.set_verbosity(verbosity)

    def set_verbosity(self, verbosity: int) -> None:
        self.setLevel(logging.DEBUG if verbosity > 1 else logging.INFO if verbosity else logging.WARNING)
        self.verbose = verbosity > 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = one_line(record.getMessage())
            if self.verbose:
                stamp = logging.Formatter().formatTime(record, "%H:%M:%S")
                line = f"{stamp}.{int(record.msecs):03d} {record.levelname:<7} {record.name}: {message}"
            else:
                line = f"aioprod: {record.levelname.lower()}: {message}"
            echo(line, err=True)
        except Exception:  # pragma: no cover - logging must never break the command
            self.handleError(record)


_stderr_logging: tuple[_StderrHandler, int, bool] | None = None  # (handler, previous level, previous propagate)


def log_to_stderr(verbosity: int) -> None:
    """The ``aioprod`` loggers on stderr while a command runs: WARNING, or more with -v/-vv.

    Called for each ``-v`` option parsed; :func:`stop_logging_to_stderr` undoes it.
    """
    global _stderr_logging
    logger = logging.getLogger("aioprod")
    if _stderr_logging is None:
        _stderr_logging = (_StderrHandler(verbosity), logger.level, logger.propagate)
        logger.addHandler(_stderr_logging[0])
        logger.propagate = False
    handler = _stderr_logging[0]
    handler.set_verbosity(verbosity)
    logger.setLevel(handler.level)


def stop_logging_to_stderr() -> None:
    global _stderr_logging
    if _stderr_logging is not None:
        handler, level, propagate = _stderr_logging
        logger = logging.getLogger("aioprod")
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
        _stderr_logging = None


def run(main: Coroutine[Any, Any, T], broker: EmbeddedBroker | None = None) -> T:
    """Run the command's coroutine on uvloop when it is installed (``aioprod[speed]``), else asyncio.

    With the command's own embedded ``broker``: its death ends the command at once (nothing
    queued can be delivered any more), as a CliError saying so, instead of retrying a broker
    that is gone until delivery.timeout.ms."""
    try:
        loop_factory = None
        try:
            import uvloop
        except ImportError:
            pass
        else:
            loop_factory = uvloop.new_event_loop
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(_interruptible(main, broker))
    finally:
        # A Ctrl-C before the loop ran it (importing uvloop, setting up the loop): "RuntimeWarning:
        # coroutine 'run_perf' was never awaited" after the command's last line. Closing a
        # coroutine that ran is a no-op.
        main.close()


#: The message of the cancellation that ends a command whose embedded broker died.
_BROKER_DIED = "aioprod: the embedded broker died"


async def _watch_broker(broker: EmbeddedBroker, task: asyncio.Task[Any], died: list[str]) -> None:
    while broker.running:
        await asyncio.sleep(0.2)
    died.append(broker.failure())
    while not task.done():  # stop sending, then abandon what is queued (close): nobody can take it
        task.cancel(_BROKER_DIED)
        await asyncio.sleep(0.05)


async def _interruptible(main: Coroutine[Any, Any, T], broker: EmbeddedBroker | None = None) -> T:
    """Ctrl-C cancels the command, every time it is pressed, then raises KeyboardInterrupt.

    asyncio's runner cancels once and raises KeyboardInterrupt wherever the second Ctrl-C
    lands, where an ``except BaseException`` may turn it into something else; a second
    cancellation instead stops whatever the command is waiting for (delivering what was
    queued, see :func:`open_producer`).
    """
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    interrupted = False

    def on_sigint() -> None:
        nonlocal interrupted
        interrupted = True
        task.cancel()

    # SIGTERM (a CI job cancelled, ``timeout``, ``docker stop``) as Ctrl-C: the command stops
    # and delivers what it queued, and an embedded broker is stopped, not orphaned.
    signals = STOP_SIGNALS
    before = {sig: signal.getsignal(sig) for sig in signals}
    try:
        for sig in signals:
            loop.add_signal_handler(sig, on_sigint)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
        return await main
    died: list[str] = []
    watcher = None if broker is None else asyncio.create_task(_watch_broker(broker, task, died))
    try:
        return await main
    except asyncio.CancelledError:
        if died:
            raise CliError(died[0]) from None
        if interrupted:
            raise KeyboardInterrupt from None
        raise
    finally:
        if watcher is not None:
            watcher.cancel()
        for sig in signals:
            loop.remove_signal_handler(sig)
            if before[sig] is not None:
                signal.signal(sig, before[sig])  # the handler around it, e.g. the embedded broker's


@contextlib.asynccontextmanager
async def open_producer(
    options: Mapping[str, Any], outcomes: AckTracker | None = None, *, quiet: bool = False
) -> AsyncIterator[Producer]:
    """A started producer, closed on the way out, delivering what is queued.

    On Ctrl-C (the command's task cancelled) too, as Kafka's console producer and kcat do:
    the command stops producing and the records already handed over are delivered; a second
    Ctrl-C abandons them, and they are counted as unsent. ``quiet``: a producer before the
    command's own (a probe), whose config log lines the command's producer says again.
    """
    with _config_unsaid(quiet):
        producer = Producer(options)
    await producer.start()
    try:
        yield producer
    except asyncio.CancelledError as exc:
        if outcomes is not None and outcomes.outstanding and exc.args != (_BROKER_DIED,):
            queued = f"{outcomes.outstanding:,} record{'' if outcomes.outstanding == 1 else 's'}"
            warn(f"interrupted: delivering the {queued} queued (Ctrl-C again to abandon them)")
        raise
    finally:
        await producer.close()


def record_outcomes(outcomes: Any) -> None:
    """Let Ctrl-C report this command's delivered/failed/unsent counts (see ``main``)."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[OUTCOMES_META] = outcomes


def output_gone(err: bool = False) -> None:
    """The reader of stdout (``err``: stderr) went away (``| head``, ``2>&1 | head``): the rest
    of that output goes nowhere, and the command goes on to its own result, as the Unix tools
    do (not rich's SystemExit(1); not ``produce`` stopped at its next failing line, the rest of
    its input never sent)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), (sys.stderr if err else sys.stdout).fileno())


def echo(text: str, *, err: bool = False) -> None:
    """``click.echo`` that survives its reader going away (see :func:`output_gone`)."""
    try:
        click.echo(text, err=err)
    except BrokenPipeError:
        output_gone(err)


class _Console(Console):
    def on_broken_pipe(self) -> None:
        self.quiet = True
        if self.file is sys.stdout or not self.stderr:
            output_gone()


def plain_output(out: Console) -> bool:
    """Plain tables (no box, no colour) when piped, or with ``NO_COLOR`` set (no-color.org)."""
    return not out.is_terminal or os.environ.get("NO_COLOR", "") != ""


def console(*, stderr: bool = False) -> Console:
    """A rich console (which honours NO_COLOR); wide when not a terminal so piped tables do not wrap."""
    out = _Console(stderr=stderr, highlight=False)
    if not out.is_terminal:
        out.width = max(out.width, 160)
    return out


def table(out: Console, *columns: str, title: str | None = None, right: tuple[str, ...] = ()) -> Table:
    """A table for ``out``: boxed on a terminal, plain aligned columns when piped or NO_COLOR."""
    plain = plain_output(out)
    result = Table(
        title=title,
        box=None if plain else box.HEAVY_HEAD,
        show_edge=not plain,
        pad_edge=not plain,
        header_style="" if plain else "bold",
        title_style="" if plain else "italic",
        title_justify="left" if plain else "center",
    )
    for name in columns:
        result.add_column(name, justify="right" if name in right else "left")
    return result


def topic_names(_ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
    """A click callback: an illegal topic name is a usage error, before anything connects."""
    for name in value if isinstance(value, tuple) else (value,):
        if name is not None:
            try:
                check_topic_name(name)
            except (TypeError, ValueError) as exc:
                raise click.BadParameter(str(exc)) from None
    return value


@contextlib.contextmanager
def stop_signals_interrupt(signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> Iterator[None]:
    """``signals`` raise KeyboardInterrupt meanwhile, so that an embedded broker is stopped.

    SIGTERM, so that ``kill`` (a CI job cancelled, ``timeout``, ``docker stop``) stops the
    broker cleanly instead of orphaning it; SIGINT explicitly, because a shell starts
    background jobs with SIGINT ignored.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def cluster_or_embedded(bootstrap: str | None) -> Iterator[tuple[str, EmbeddedBroker | None]]:
    """The given cluster, or an embedded broker for the command's lifetime when none is given."""
    if bootstrap:
        yield bootstrap, None
        return
    # Outside the command's loop (starting and stopping the broker), where _interruptible's
    # handler is not: a SIGTERM there stops the broker too.
    with stop_signals_interrupt(tuple(sig for sig in STOP_SIGNALS if sig != signal.SIGINT)):
        try:
            broker = EmbeddedBroker().start()
        except EmbeddedBrokerError as exc:
            raise CliError(f"{exc} (or give a cluster: -b HOST:PORT)") from exc
        try:
            yield broker.bootstrap, broker
        finally:
            broker.stop()


def embedded_hint(broker: EmbeddedBroker | None) -> str:
    """When the embedded broker died, that is the real story of a failure: say so."""
    if broker is None or broker.running:
        return ""
    return f" ({broker.failure()})"
