"""The plan of a write: everything a partition's writer needs, as plain picklable data.

The closure shipped to the executors captures only a :class:`Plan` (producer options as a
dict, the topic, the column layout, the error policy) — and for an exactly-once write the
accumulator its tasks report their transactions to — never a producer or a SparkSession.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aioprod.config import _SECRET_FIELDS, ProducerConfig, Secret, _canonical_name, _what_aioprod_does
from aioprod.errors import ConfigError

#: Producer settings tuned for bulk writes; every one can be overridden by the caller.
SPARK_PRODUCER_DEFAULTS: Mapping[str, Any] = {"linger_ms": 20, "batch_size": 256 * 1024}
#: Exactly-once writes keep every transaction open until the whole write has succeeded: by
#: default as long as Kafka lets one stay open (its ``transaction.max.timeout.ms`` default).
EXACTLY_ONCE_TRANSACTION_TIMEOUT_MS = 900_000


@dataclass(frozen=True)
class Plan:
    """Plain, picklable description of a write: what the executor closure captures."""

    options: dict[str, Any]
    topic: str | None
    has_key: bool
    has_topic: bool
    has_partition: bool
    has_headers: bool
    errors: str
    max_errors: int
    max_in_flight_rows: int
    close_timeout: float | None
    #: Exactly-once: every writer writes in one transaction named after ``write_id`` (see :meth:`transactional_id`).
    exactly_once: bool = False
    write_id: str | None = None
    #: Exactly-once from the executors, speculation off: a task attempt whose transactional id
    #: another producer took while it wrote fails, so that Spark runs it again (see
    #: :class:`aioprod.spark.executors.FencedAttemptError`).
    retry_fenced: bool = False

    @property
    def columns(self) -> list[str]:
        """The prepared DataFrame's columns, in order (see :func:`aioprod.spark.schema.prepare`)."""
        names = ["value"]
        names += ["key"] if self.has_key else []
        names += ["topic"] if self.has_topic else []
        names += ["partition"] if self.has_partition else []
        names += ["headers"] if self.has_headers else []
        return names

    def transactional_id(self, unit: str) -> str:
        """The transactional id of one unit of an exactly-once write (a Spark partition's index,
        or ``"driver"``), and the consumer group whose committed offset marks it committed."""
        assert self.write_id is not None
        return f"{self.write_id}-{unit}"


def producer_options(
    bootstrap_servers: Any, producer_config: Mapping[str, Any], *, exactly_once: bool = False
) -> dict[str, Any]:
    """The producer options every writer of the write uses, validated here on the driver."""
    options: dict[str, Any] = {}
    for raw, value in producer_config.items():
        if _what_aioprod_does(raw, value):
            continue  # what aioprod always does: taken, as ProducerConfig takes it
        name = _canonical_name(raw)
        if value is None:
            continue  # the option's default, the writer's own (below) where it has one
        if name in options:
            raise ConfigError(f"option {name!r} given twice (as {raw!r})")
        if name in ("key_serializer", "value_serializer"):
            raise ConfigError(f"{name} does not apply: the DataFrame's key and value columns are already bytes")
        if name in _SECRET_FIELDS and isinstance(value, str):
            # The plan is held, and shipped, as it is: its repr (a debugger's, an error reporter's
            # frame locals) showed the password.
            value = Secret(value)
        options[name] = value
    if "bootstrap_servers" in options:
        raise ConfigError("give bootstrap_servers once, as the bootstrap_servers= argument")
    options["bootstrap_servers"] = bootstrap_servers
    for name, value in SPARK_PRODUCER_DEFAULTS.items():
        options.setdefault(name, value)
    if "transactional_id" in options:
        raise ConfigError(
            "transactional_id does not apply: "
            + (
                "an exactly-once write names its transactions after write_id"
                if exactly_once
                else "pass exactly_once=True for transactional writes"
            )
        )
    if exactly_once:
        options.setdefault("transaction_timeout_ms", EXACTLY_ONCE_TRANSACTION_TIMEOUT_MS)
        # Every mistake raises on the driver, before any job; transactions need idempotence.
        try:
            ProducerConfig.from_options({**options, "transactional_id": "aioprod-check"})
        except ConfigError as exc:
            ProducerConfig.from_options(options)  # a mistake of the options' own raises as it is
            # The user set no transactional_id: say what exactly_once needs.
            raise ConfigError(f"exactly_once=True writes in transactions: {exc}") from None
    else:
        ProducerConfig.from_options(options)
    return options


def check_options_travel(options: Mapping[str, Any]) -> None:
    """Raise ``ConfigError`` naming an option that cannot be pickled to the executors.

    Checked on the driver, with the pickler Spark ships closures with: in the job it failed as a
    ``PicklingError`` naming no option, after Spark printed its traceback.
    """
    from pyspark import cloudpickle

    for name, value in options.items():
        try:
            cloudpickle.dumps(value)  # type: ignore[no-untyped-call]
        except Exception as exc:
            hint = (
                ": give the PEM file options instead (ssl_ca_location=, ssl_certificate_location=,"
                " ssl_key_location=): each executor builds its context from the files"
                if name == "ssl_context"
                else ": use a module-level function or a picklable object, or mode='driver'"
            )
            raise ConfigError(
                f"option {name!r} cannot travel to the executors ({type(exc).__name__}: {exc}){hint}"
            ) from exc
