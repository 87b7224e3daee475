"""The ``aioprod`` command group: registers the commands and turns every failure into one line.

Failures are for people, not for debuggers: one ``aioprod: error: ...`` line on stderr
and a documented exit code, usage mistakes included (click's "did you mean" kept);
``--debug`` adds the traceback. Ctrl-C says what became of the records sent so far.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from aioprod import __version__
from aioprod.cli.broker import broker
from aioprod.cli.common import (
    DEBUG_META,
    EXIT_INTERRUPTED,
    EXIT_OK,
    OUTCOMES_META,
    CliError,
    CliUsageError,
    debug_option,
    describe,
    docs_url,
    echo,
    one_line,
    stop_logging_to_stderr,
)
from aioprod.cli.metadata import metadata
from aioprod.cli.perf import perf
from aioprod.cli.produce import produce
from aioprod.cli.smoke import smoke
from aioprod.errors import ConfigError


class AioprodGroup(click.Group):
    """A group whose commands fail with one readable line and a documented exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.Abort):
            raise
        except click.ClickException as exc:
            if isinstance(exc, CliError) and ctx.meta.get(DEBUG_META):
                _print_traceback(exc)
            raise
        except KeyboardInterrupt:
            outcomes = ctx.meta.get(OUTCOMES_META)
            echo(f"aioprod: interrupted{': ' + outcomes.counts() if outcomes is not None else ''}", err=True)
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
        except Exception as exc:
            if ctx.meta.get(DEBUG_META):
                _print_traceback(exc)
            if isinstance(exc, ConfigError):
                raise CliUsageError(describe(exc)) from exc
            raise CliError(describe(exc)) from exc

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """As click's, but a usage error is one ``aioprod: error: ...`` line too (exit code 2)."""
        try:
            if not standalone_mode:
                return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as exc:
            _exit_usage(exc)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.Abort:
            echo("aioprod: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        finally:
            stop_logging_to_stderr()
        sys.exit(result if isinstance(result, int) else EXIT_OK)


#: Flags of kafka-producer-perf-test (and kafka-console-producer) that aioprod spells otherwise.
_JAVA_FLAGS = {"--producer-props": "-X KEY=VALUE, once per option", "--producer.config": "-F FILE"}


def _exit_usage(exc: click.UsageError) -> NoReturn:
    if type(exc).__name__ == "NoArgsIsHelpError":  # `aioprod` alone: the help is the answer
        exc.show()
        sys.exit(exc.exit_code)
    where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
    message = one_line(exc.format_message())
    java = _JAVA_FLAGS.get(exc.option_name) if isinstance(exc, click.NoSuchOption) else None
    if java is not None:
        message = f"{message.rstrip('.')}: aioprod's is {java}"
    echo(f"aioprod: error: {message}{where}", err=True)
    sys.exit(exc.exit_code)


def _print_traceback(exc: BaseException) -> None:
    click.echo("".join(traceback.format_exception(exc)).rstrip(), err=True)


@click.group(
    cls=AioprodGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=f"""\b
Environment:
  AIOPROD_BOOTSTRAP_SERVERS  default for -b/--bootstrap-servers
  AIOPROD_CONFIG_FILE        default for -F/--config-file
  AIOPROD_<OPTION>           a producer option, e.g. AIOPROD_LINGER_MS=10 (-X wins)
  AIOPROD_DEBUG=1            same as --debug
  NO_COLOR                   plain output, no colours or boxes

\b
Exit codes:
  0    success
  1    the command failed (records failed, a check failed, broker unreachable)
  2    usage error (unknown flag, bad -X option, no bootstrap servers)
  130  interrupted (Ctrl-C)

Documentation: {docs_url("cli/")}""",
)
@click.version_option(__version__, "-V", "--version", prog_name="aioprod")
@debug_option
def cli() -> None:
    """aioprod: an asyncio-native Apache Kafka producer, from the command line.

    Producer options are given as -X key=value with the Java client's names
    (e.g. -X linger.ms=10 -X acks=1 -X compression.type=lz4), from a Java .properties
    file with -F, or as AIOPROD_<OPTION> environment variables, on every command
    that produces.

    \b
    Examples:
      aioprod smoke                                  # embedded broker, no setup
      aioprod smoke -b kafka1:9092,kafka2:9092
      echo 'k1:hello' | aioprod produce greetings -b localhost:9092 -K :
      aioprod perf -t perf -n 100000 -s 100 --throughput 20000
      aioprod metadata -b localhost:9092 -t greetings
      aioprod broker --port 9092
    """


cli.add_command(smoke)
cli.add_command(produce)
cli.add_command(perf)
cli.add_command(metadata)
cli.add_command(broker)


def main() -> None:
    """Console-script entry point (``aioprod``)."""
    cli(prog_name="aioprod")
