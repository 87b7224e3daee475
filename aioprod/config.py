"""The producer's configuration: one frozen, validated object.

Options are accepted in snake_case (``linger_ms``) and in the Java/librdkafka dotted
form (``"linger.ms"``), so settings carry over from other clients unchanged. Every
mistake is reported when the producer is constructed, naming the option.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aioprod.errors import ConfigError

Serializer = Callable[[Any], bytes | None]
#: ``(topic, key_bytes, partitions) -> partition``; ``partitions`` lists every partition id.
PartitionerFn = Callable[[str, bytes | None, Sequence[int]], int]

COMPRESSION_TYPES = ("none", "gzip", "snappy", "lz4", "zstd")
PARTITIONERS = ("default", "murmur2_random", "sticky", "round_robin")
INT32_MAX = 2**31 - 1

# librdkafka names that differ from Java's for the same setting.
_ALIASES = {
    "queue_buffering_max_ms": "linger_ms",
    "compression_codec": "compression_type",
    "message_timeout_ms": "delivery_timeout_ms",
    "request_required_acks": "acks",
    "metadata_broker_list": "bootstrap_servers",
    "max_in_flight": "max_in_flight_requests_per_connection",
    "message_max_bytes": "max_request_size",
    "queue_buffering_max_kbytes": None,  # different unit: refuse rather than guess
}


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """Validated producer settings; defaults follow the Java client 4.x."""

    bootstrap_servers: tuple[tuple[str, int], ...]
    client_id: str = "aioprod"
    acks: int = -1
    enable_idempotence: bool = True
    compression_type: str = "none"
    compression_level: int | None = None
    batch_size: int = 16384
    linger_ms: int = 5
    buffer_memory: int = 32 * 1024 * 1024
    max_block_ms: int = 60_000
    request_timeout_ms: int = 30_000
    delivery_timeout_ms: int = 120_000
    retries: int = INT32_MAX
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1000
    reconnect_backoff_ms: int = 50
    reconnect_backoff_max_ms: int = 1000
    socket_connection_setup_timeout_ms: int = 10_000
    socket_connection_setup_timeout_max_ms: int = 30_000
    metadata_max_age_ms: int = 300_000
    metadata_max_idle_ms: int = 300_000
    max_in_flight_requests_per_connection: int = 5
    max_request_size: int = 1024 * 1024
    allow_auto_create_topics: bool = True
    partitioner: str | PartitionerFn = "default"
    key_serializer: Serializer | None = None
    value_serializer: Serializer | None = None
    transactional_id: str | None = None
    security_protocol: str = "PLAINTEXT"

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None = None, **kwargs: Any) -> ProducerConfig:
        """Build from a mapping (dotted or snake names) and/or keyword arguments."""
        merged: dict[str, Any] = {}
        explicit: set[str] = set()
        for source in (options or {}), kwargs:
            for raw_name, value in source.items():
                name = _canonical_name(raw_name)
                if name in merged:
                    raise ConfigError(f"option {name!r} given twice (as {raw_name!r})")
                merged[name] = value
                explicit.add(name)
        if "bootstrap_servers" not in merged:
            raise ConfigError("bootstrap_servers is required, e.g. '127.0.0.1:9092'")
        values = {name: _coerce(name, value) for name, value in merged.items()}
        config = cls(**values)
        config._check(explicit)
        return config

    def _check(self, explicit: set[str]) -> None:
        def positive(name: str, minimum: int = 0) -> None:
            value = getattr(self, name)
            if value < minimum:
                raise ConfigError(f"{name} must be >= {minimum}, got {value}")

        for name in (
            "linger_ms",
            "max_block_ms",
            "retries",
            "retry_backoff_ms",
            "reconnect_backoff_ms",
            "metadata_max_age_ms",
        ):
            positive(name)
        for name in (
            "batch_size",
            "buffer_memory",
            "request_timeout_ms",
            "delivery_timeout_ms",
            "max_in_flight_requests_per_connection",
            "max_request_size",
            "socket_connection_setup_timeout_ms",
        ):
            positive(name, 1)
        if self.metadata_max_idle_ms < 5000:
            raise ConfigError(f"metadata_max_idle_ms must be >= 5000, got {self.metadata_max_idle_ms}")
        if self.acks not in (-1, 0, 1):
            raise ConfigError(f"acks must be 'all', -1, 0 or 1, got {self.acks}")
        if self.compression_type not in COMPRESSION_TYPES:
            raise ConfigError(
                f"compression_type must be one of {', '.join(COMPRESSION_TYPES)}, got {self.compression_type!r}"
            )
        if isinstance(self.partitioner, str) and self.partitioner not in PARTITIONERS:
            raise ConfigError(
                f"partitioner must be one of {', '.join(PARTITIONERS)} or a callable, got {self.partitioner!r}"
            )
        if self.retry_backoff_max_ms < self.retry_backoff_ms:
            raise ConfigError(
                f"retry_backoff_max_ms ({self.retry_backoff_max_ms}) is below "
                f"retry_backoff_ms ({self.retry_backoff_ms})"
            )
        if self.socket_connection_setup_timeout_max_ms < self.socket_connection_setup_timeout_ms:
            raise ConfigError(
                f"socket_connection_setup_timeout_max_ms ({self.socket_connection_setup_timeout_max_ms}) is below "
                f"socket_connection_setup_timeout_ms ({self.socket_connection_setup_timeout_ms})"
            )
        if self.reconnect_backoff_max_ms < self.reconnect_backoff_ms:
            raise ConfigError(
                f"reconnect_backoff_max_ms ({self.reconnect_backoff_max_ms}) is below "
                f"reconnect_backoff_ms ({self.reconnect_backoff_ms})"
            )
        if self.delivery_timeout_ms < self.linger_ms + self.request_timeout_ms:
            raise ConfigError(
                f"delivery_timeout_ms ({self.delivery_timeout_ms}) must be at least "
                f"linger_ms + request_timeout_ms ({self.linger_ms + self.request_timeout_ms})"
            )
        if self.security_protocol != "PLAINTEXT":
            raise ConfigError(f"security_protocol {self.security_protocol!r} is not supported yet")
        if self.transactional_id is not None:
            raise ConfigError("transactional_id: transactions are not supported yet")
        if self.enable_idempotence:
            conflicts = []
            if self.acks != -1:
                conflicts.append(f"acks={self.acks} (needs 'all')")
            if self.retries == 0:
                conflicts.append("retries=0 (needs > 0)")
            if self.max_in_flight_requests_per_connection > 5:
                conflicts.append(
                    f"max_in_flight_requests_per_connection={self.max_in_flight_requests_per_connection} (needs <= 5)"
                )
            if conflicts:
                if "enable_idempotence" in explicit:
                    raise ConfigError("enable_idempotence=True conflicts with " + ", ".join(conflicts))
                # Like the Java client: idempotence is only a default, so settings that
                # cannot have it quietly turn it off instead of failing.
                object.__setattr__(self, "enable_idempotence", False)


_FIELDS = {f.name: f for f in dataclasses.fields(ProducerConfig)}
_INT_FIELDS = {
    name for name, f in _FIELDS.items() if f.type in ("int", "int | None") and name not in ("acks", "compression_level")
}
_BOOL_FIELDS = {name for name, f in _FIELDS.items() if f.type == "bool"}


def _canonical_name(raw: str) -> str:
    if not isinstance(raw, str):
        raise ConfigError(f"option names must be strings, got {raw!r}")
    name = raw.strip().replace(".", "_").replace("-", "_").lower()
    if name in _ALIASES:
        alias = _ALIASES[name]
        if alias is None:
            raise ConfigError(f"option {raw!r} is not supported; use buffer_memory (bytes)")
        name = alias
    if name not in _FIELDS:
        close = difflib.get_close_matches(name, list(_FIELDS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown option {raw!r}{hint}")
    return name


def _coerce(name: str, value: Any) -> Any:
    """Accept the string forms a command line or properties file would give."""
    if name == "bootstrap_servers":
        return parse_bootstrap_servers(value)
    if name == "acks":
        if value in ("all", "-1", -1):
            return -1
        if value in ("0", "1", 0, 1):
            return int(value)
        raise ConfigError(f"acks must be 'all', -1, 0 or 1, got {value!r}")
    if name in _BOOL_FIELDS:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    if name in _INT_FIELDS or name == "compression_level":
        if value is None and name == "compression_level":
            return None
        if isinstance(value, bool):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if name == "compression_type":
        if not isinstance(value, str):
            raise ConfigError(f"compression_type must be a string, got {value!r}")
        return value.lower()
    if name == "partitioner":
        if callable(value) or isinstance(value, str):
            return value
        raise ConfigError(f"partitioner must be a name or a callable, got {value!r}")
    if name in ("key_serializer", "value_serializer"):
        if value is not None and not callable(value):
            raise ConfigError(f"{name} must be callable, got {value!r}")
        return value
    if name in ("client_id", "security_protocol", "transactional_id"):
        if value is None and name == "transactional_id":
            return None
        if not isinstance(value, str) or (name == "transactional_id" and not value):
            raise ConfigError(f"{name} must be a non-empty string, got {value!r}")
        return value.upper() if name == "security_protocol" else value
    return value


def parse_bootstrap_servers(value: Any) -> tuple[tuple[str, int], ...]:
    """``"h1:9092,h2:9093"`` or a list of ``"host:port"`` → ((host, port), ...)."""
    items: Sequence[Any]
    if isinstance(value, str):
        items = [part for part in value.split(",") if part.strip()]
    elif isinstance(value, Sequence):
        items = value
    else:
        raise ConfigError(f"bootstrap_servers must be 'host:port[,host:port]', got {value!r}")
    servers = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"bootstrap_servers entry must be 'host:port', got {item!r}")
        text = item.strip()
        for prefix in ("PLAINTEXT://", "plaintext://", "tcp://"):
            text = text.removeprefix(prefix)
        host, sep, port_text = text.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ConfigError(f"bootstrap_servers entry must be 'host:port', got {item!r}")
        servers.append((host, int(port_text)))
    if not servers:
        raise ConfigError("bootstrap_servers is empty")
    return tuple(servers)
