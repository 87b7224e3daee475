"""The producer's configuration: one frozen, validated object.

Options are accepted in snake_case (``linger_ms``) and in the Java/librdkafka dotted
form (``"linger.ms"``), so settings carry over from other clients unchanged. Every
mistake is reported when the producer is constructed, naming the option.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import logging
import os
import re
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aioprod.errors import ConfigError, UnsupportedOptionError
from aioprod.event_log import ClientLogger

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from aioprod.metrics import MetricsSnapshot
    from aioprod.tracing import Telemetry

Serializer = Callable[[Any], bytes | None]
#: ``(topic, key_bytes, partitions) -> partition``; ``partitions`` lists every partition id.
PartitionerFn = Callable[[str, bytes | None, Sequence[int]], int]

COMPRESSION_TYPES = ("none", "gzip", "snappy", "lz4", "zstd")
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
#: ``(snapshot) -> None`` or ``async (snapshot) -> None``, called every ``statistics_interval_ms``.
StatisticsCallback = Callable[["MetricsSnapshot"], Any]
#: ``() -> token`` or ``async () -> token``; see :class:`aioprod.net.auth.OAuthBearerToken`.
TokenProvider = Callable[[], Any]
PARTITIONERS = ("default", "murmur2_random", "sticky", "round_robin", "consistent_random")
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
#: The port of a bootstrap server given without one.
DEFAULT_PORT = 9092
INT16_MAX = 2**15 - 1

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
    "sasl_mechanisms": "sasl_mechanism",
    "message_send_max_retries": "retries",  # librdkafka: retries is its alias
    # aiokafka's names, so its users' settings carry over too.
    "sasl_plain_username": "sasl_username",
    "sasl_plain_password": "sasl_password",
    "ssl_cafile": "ssl_ca_location",
    "ssl_certfile": "ssl_certificate_location",
    "ssl_keyfile": "ssl_key_location",
    "max_batch_size": "batch_size",  # the same bytes per partition's batch
    # confluent-kafka's name for librdkafka's statistics callback.
    "stats_cb": "statistics_callback",
}

#: Kafka client options aioprod does not implement, by why. A Java client.properties (Confluent
#: Cloud's carries a consumer's and Schema Registry's) is refused by name, not met with a
#: "did you mean" for an unrelated option; ``aioprod -F`` skips them with a warning.
_CONSUMER_OPTION = "a consumer option (aioprod is a producer)"
_REGISTRY_OPTION = "a Schema Registry option: give aioprod a key_serializer/value_serializer instead"
_JAVA_OPTION = "a Java client option aioprod does not implement"
_KEYSTORE_OPTION = (
    "a Java keystore option: give PEM files in ssl_ca_location, ssl_certificate_location and ssl_key_location"
)
UNSUPPORTED_OPTIONS = {
    **dict.fromkeys(
        (
            "group_id",
            "group_instance_id",
            "session_timeout_ms",
            "heartbeat_interval_ms",
            "auto_offset_reset",
            "enable_auto_commit",
            "auto_commit_interval_ms",
            "max_poll_records",
            "max_poll_interval_ms",
            "isolation_level",
            "fetch_min_bytes",
            "fetch_max_bytes",
            "fetch_max_wait_ms",
            "max_partition_fetch_bytes",
            "partition_assignment_strategy",
            "key_deserializer",
            "value_deserializer",
            "client_rack",
            "check_crcs",
            "default_api_timeout_ms",
            "exclude_internal_topics",
            "group_protocol",
            "group_remote_assignor",
            # librdkafka's consumer options, in a dict a confluent Consumer shares or a kcat -F file
            "enable_partition_eof",
            "enable_auto_offset_store",
            "fetch_wait_max_ms",
            "fetch_message_max_bytes",
            "fetch_error_backoff_ms",
            "fetch_queue_backoff_ms",
            "queued_min_messages",
            "queued_max_messages_kbytes",
            "consume_callback_max_messages",
            "coordinator_query_interval_ms",
            "offset_store_method",
            "group_protocol_type",
            "consume_cb",
            "rebalance_cb",
            "offset_commit_cb",
        ),
        _CONSUMER_OPTION,
    ),
    **dict.fromkeys(
        (
            "schema_registry_url",
            "basic_auth_credentials_source",
            "basic_auth_user_info",
            "schema_registry_basic_auth_user_info",
        ),
        _REGISTRY_OPTION,
    ),
    **dict.fromkeys(
        (
            "client_dns_lookup",
            "send_buffer_bytes",
            "receive_buffer_bytes",
            "interceptor_classes",
            "metric_reporters",
            "metrics_recording_level",
            "security_providers",
            "ssl_protocol",
            "ssl_enabled_protocols",
            "ssl_cipher_suites",
            "ssl_provider",
            "ssl_secure_random_implementation",
            "ssl_engine_factory_class",
            "enable_metrics_push",
            "auto_include_jmx_reporter",
            "metadata_recovery_strategy",
            "sasl_client_callback_handler_class",
        ),
        _JAVA_OPTION,
    ),
    "topic_metadata_refresh_interval_ms": (
        "librdkafka's refresh period: give metadata_max_age_ms, Java's name for it (librdkafka's own "
        "metadata.max.age.ms is its cache's age, not the same option)"
    ),
    # librdkafka's (confluent-kafka's) own, with what to do instead.
    "error_cb": (
        "confluent-kafka's error callback: aioprod raises errors from its calls and records' futures, and "
        "logs the rest through the 'aioprod' logger"
    ),
    "on_delivery": (
        "confluent-kafka's delivery callback: add a callback to each record's future "
        "(send(...).add_done_callback), or await it"
    ),
    "logger": "confluent-kafka's: aioprod logs through the standard logging module, logger 'aioprod'",
    "log_level": "librdkafka's: set the level of the 'aioprod' logger (logging.getLogger('aioprod'))",
    "debug": "librdkafka's debug contexts: set the 'aioprod' logger to DEBUG, or pass --debug to the CLI",
    "queue_buffering_max_messages": (
        "librdkafka's record count bound: aioprod bounds the queue in bytes, buffer_memory"
    ),
    "batch_num_messages": "librdkafka's record count per batch: aioprod bounds a batch in bytes, batch_size",
    "api_version_request": "librdkafka's: aioprod always asks the broker for its API versions",
    "broker_version_fallback": "librdkafka's: aioprod always asks the broker for its API versions",
    "socket_keepalive_enable": "a librdkafka socket option aioprod does not implement",
    "socket_nagle_disable": "librdkafka's: aioprod's connections always disable Nagle's algorithm (TCP_NODELAY)",
    "enable_gapless_guarantee": (
        "a librdkafka option aioprod does not implement: docs/delivery.md says what a failed record "
        "means for its partition's later ones"
    ),
    "sticky_partitioning_linger_ms": (
        "librdkafka's: aioprod's keyless records move to another partition after a batch's worth (batch_size)"
    ),
    **dict.fromkeys(
        ("ssl_key_pem", "ssl_certificate_pem", "ssl_ca_pem", "https_ca_pem", "ssl_key", "ssl_certificate", "ssl_ca"),
        "librdkafka's PEM text in the configuration: write it to a file and give its path in ssl_ca_location, "
        "ssl_certificate_location or ssl_key_location, or give an ssl_context",
    ),
    **dict.fromkeys(
        ("dr_cb", "dr_msg_cb", "delivery_report_only_error"),
        "librdkafka's delivery reports: each record's future tells its outcome (add_done_callback, or await it)",
    ),
    "oauth_cb": (
        "confluent-kafka's OAUTHBEARER callback: give aioprod a sasl_oauth_token_provider, a callable "
        "(no argument) returning (token, expires_at in seconds since the epoch)"
    ),
    "oauthbearer_token_refresh_cb": (
        "librdkafka's: give aioprod a sasl_oauth_token_provider (a callable returning the token)"
    ),
    "socket_timeout_ms": "librdkafka's: request_timeout_ms bounds each request",
    **dict.fromkeys(
        (
            "builtin_features",
            "message_copy_max_bytes",
            "receive_message_max_bytes",
            "topic_metadata_refresh_fast_interval_ms",
            "topic_metadata_refresh_sparse",
            "topic_metadata_propagation_max_ms",
            "topic_blacklist",
            "socket_send_buffer_bytes",
            "socket_receive_buffer_bytes",
            "socket_max_fails",
            "broker_address_ttl",
            "broker_address_family",
            "enabled_events",
            "throttle_cb",
            "log_cb",
            "log_queue",
            "log_thread_name",
            "enable_random_seed",
            "log_connection_close",
            "background_event_cb",
            "socket_cb",
            "connect_cb",
            "closesocket_cb",
            "open_cb",
            "resolve_cb",
            "opaque",
            "default_topic_conf",
            "internal_termination_signal",
            "api_version_request_timeout_ms",
            "ssl_curves_list",
            "ssl_sigalgs_list",
            "https_ca_location",
            "ssl_ca_certificate_stores",
            "ssl_crl_location",
            "ssl_providers",
            "ssl_engine_id",
            "ssl_engine_callback_data",
            "ssl_certificate_verify_cb",
            "enable_sasl_oauthbearer_unsecure_jwt",
            "plugin_library_paths",
            "interceptors",
            "queue_buffering_backpressure_threshold",
        ),
        "a librdkafka option aioprod does not implement",
    ),
    # librdkafka's deprecated ones, which librdkafka itself no longer reads (an older confluent-kafka
    # configuration carries them): "unknown option", some with a misleading "did you mean"
    # (socket.blocking.max.ms: 'retry.backoff.max.ms'; ssl.engine.location: 'ssl.key.location').
    **dict.fromkeys(
        (
            "socket_blocking_max_ms",
            "topic_metadata_refresh_fast_cnt",
            "reconnect_backoff_jitter_ms",
            "produce_offset_report",
        ),
        "a deprecated librdkafka option (librdkafka no longer uses it either): remove it",
    ),
    # Deprecated in librdkafka, which still acts on them: not "no longer used".
    "api_version_fallback_ms": (
        "a deprecated librdkafka option (how long broker.version.fallback stands in when ApiVersion "
        "fails): aioprod always asks the broker for its API versions: remove it"
    ),
    **dict.fromkeys(
        ("queuing_strategy", "msg_order_cmp"),
        "a deprecated, experimental librdkafka option (its queue's order): aioprod sends a partition's "
        "records in the order send() took them: remove it",
    ),
    "ssl_engine_location": (
        "a deprecated librdkafka option (an OpenSSL engine to load, a key in an HSM, say): aioprod's TLS "
        "(Python's ssl module) loads no engine: give the key as ssl_key_location, or an ssl_context"
    ),
    "partitioner_cb": (
        "librdkafka's partitioner callback: give aioprod's partitioner option a callable "
        "(topic, key, partitions) -> partition"
    ),
    "transaction_two_phase_commit_enable": (
        "Java's KIP-939 switch: aioprod's prepare_transaction() needs no option (docs/transactions.md)"
    ),
    "api_version": (
        "aiokafka's: aioprod negotiates each request's version with the broker (ApiVersions), as "
        "api_version='auto' asks; a pinned version cannot be honoured: remove it"
    ),
    "enable_ssl_certificate_verification": (
        "librdkafka's: aioprod always verifies the broker's certificate chain; "
        "ssl_endpoint_identification_algorithm='' skips the host name check, an ssl_context of your own anything else"
    ),
}


class Secret:
    """A password or token: ``repr()`` and ``str()`` show ``'***'``, :meth:`reveal` the value.

    So that printing a config, logging it or formatting an exception never leaks it.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "'***'"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


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
    connections_max_idle_ms: int = 540_000
    socket_connection_setup_timeout_ms: int = 10_000
    socket_connection_setup_timeout_max_ms: int = 30_000
    metadata_max_age_ms: int = 300_000
    metadata_max_idle_ms: int = 300_000
    metadata_recovery_rebootstrap_trigger_ms: int = 300_000
    max_in_flight_requests_per_connection: int = 5
    max_request_size: int = 1024 * 1024
    allow_auto_create_topics: bool = True
    partitioner: str | PartitionerFn = "default"
    key_serializer: Serializer | None = None
    value_serializer: Serializer | None = None
    transactional_id: str | None = None
    transaction_timeout_ms: int = 60_000
    security_protocol: str = "PLAINTEXT"
    ssl_context: ssl.SSLContext | None = None
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: Secret | None = None
    ssl_endpoint_identification_algorithm: str = "https"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = None
    sasl_jaas_config: Secret | None = None
    sasl_oauth_token_provider: TokenProvider | None = None
    metrics_sample_window_ms: int = 30_000
    metrics_num_samples: int = 2
    statistics_interval_ms: int = 0
    statistics_callback: StatisticsCallback | None = None
    telemetry: Telemetry | None = None
    #: The context connections use (``ssl_context``, or one built from the PEM options).
    tls_context: ssl.SSLContext | None = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None = None, **kwargs: Any) -> ProducerConfig:
        """Build from a mapping (dotted or snake names) and/or keyword arguments."""
        merged: dict[str, Any] = {}
        explicit: set[str] = set()
        spelled: dict[str, str] = {}  # each option as the user wrote it first
        if options is not None and not isinstance(options, Mapping):
            hint = " (bootstrap_servers=...?)" if isinstance(options, str | list | tuple) else ""
            raise ConfigError(
                f"the positional argument is a mapping of options, e.g. {{'bootstrap.servers': 'host:9092'}}; "
                f"got {type(options).__name__}{hint}"
            )
        for source in (options or {}), kwargs:
            for raw_name, value in source.items():
                if _what_aioprod_does(raw_name, value):
                    continue
                name = _canonical_name(raw_name)
                if name in merged:
                    raise ConfigError(f"option {name!r} given twice: as {spelled[name]!r} and as {raw_name!r}")
                merged[name] = value
                spelled[name] = raw_name
                if value is not None:  # None is an option left at its default, not set
                    explicit.add(name)
        if merged.get("bootstrap_servers") is None:
            raise ConfigError("bootstrap_servers is required, e.g. '127.0.0.1:9092'")
        if snake_name(spelled.get("delivery_timeout_ms", "")) == "message_timeout_ms" and str(
            merged["delivery_timeout_ms"]
        ).strip() in ("0", "0.0"):
            raise ConfigError(
                f"{spelled['delivery_timeout_ms']}=0 is librdkafka's 'no limit', which aioprod does not have "
                f"(delivery_timeout_ms bounds every record): give a long one, e.g. 3600000 for an hour"
            )
        # None is the option's default (aiokafka's compression_type=None, say), whatever its type.
        values = {name: _coerce(name, value) for name, value in merged.items() if value is not None}
        if values.get("compression_level") == -1 and values.get("compression_type", "none") != "zstd":
            del values["compression_level"]  # librdkafka's default, the codec's own level (-1 is a zstd level)
        set_levels = {_CODEC_LEVELS[name]: values.pop(name) for name in list(values) if name in _CODEC_LEVELS}
        codec_levels = {codec: level for codec, level in set_levels.items() if level is not None}
        if codec_levels:
            from aioprod.protocol.records.compression import resolve_codec, resolve_level

            for codec, level in codec_levels.items():  # each checked against its codec, as Java does
                try:
                    resolve_level(resolve_codec(codec), level)
                except ConfigError as exc:
                    raise ConfigError(str(exc).replace("compression_level", f"compression.{codec}.level", 1)) from None
            chosen = str(values.get("compression_type", "none"))
            if chosen in codec_levels:
                if values.get("compression_level") is not None:  # None: not set
                    raise ConfigError(f"compression_level and compression.{chosen}.level both set")
                values["compression_level"] = codec_levels[chosen]
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
            "metadata_recovery_rebootstrap_trigger_ms",
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
            "metrics_sample_window_ms",
            "metrics_num_samples",
        ):
            positive(name, 1)
        positive("statistics_interval_ms")
        # Sent as (or bounded by) int32 fields of the protocol: larger values failed only at the
        # first request, deep in the encoder.
        for name in _INT_FIELDS:
            if getattr(self, name) > INT64_MAX:
                raise ConfigError(f"{name} must be <= {INT64_MAX} (Java's Long.MAX_VALUE), got {getattr(self, name)}")
        for name in ("request_timeout_ms", "transaction_timeout_ms", "batch_size", "max_request_size"):
            if getattr(self, name) > INT32_MAX:
                raise ConfigError(
                    f"{name} must be <= {INT32_MAX} (an int32 in the protocol), got {getattr(self, name)}"
                )
        for name in ("client_id", "transactional_id"):
            text = getattr(self, name)
            _check_utf8(name, text)  # sent as UTF-8: a lone surrogate raised UnicodeEncodeError, naming no option
            if text is not None and len(text.encode()) > INT16_MAX:
                raise ConfigError(
                    f"{name} must be at most {INT16_MAX} bytes (a protocol string), got {len(text.encode())}"
                )
        if self.compression_level is not None:
            from aioprod.protocol.records.compression import resolve_codec, resolve_level

            resolve_level(resolve_codec(self.compression_type), self.compression_level)
        if self.statistics_interval_ms and self.statistics_callback is None:
            raise ConfigError("statistics_interval_ms is set but statistics_callback is not: nothing would get them")
        if self.statistics_callback is not None and not self.statistics_interval_ms:
            raise ConfigError("statistics_callback needs statistics_interval_ms > 0 (how often to call it)")
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
        for base, cap in (
            ("retry_backoff_ms", "retry_backoff_max_ms"),
            ("socket_connection_setup_timeout_ms", "socket_connection_setup_timeout_max_ms"),
            ("reconnect_backoff_ms", "reconnect_backoff_max_ms"),
        ):
            if getattr(self, cap) >= getattr(self, base):
                continue
            if cap in explicit:
                raise ConfigError(f"{cap} ({getattr(self, cap)}) is below {base} ({getattr(self, base)})")
            # Java takes a base above the default maximum (a static backoff or timeout), and
            # librdkafka has no socket_connection_setup_timeout_max_ms: only both set is refused.
            object.__setattr__(self, cap, getattr(self, base))
        if (
            self.delivery_timeout_ms < self.linger_ms + self.request_timeout_ms
            and "delivery_timeout_ms" not in explicit
        ):
            # As Java's configureDeliveryTimeout: only a value the user set is refused; the
            # default follows linger_ms + request_timeout_ms.
            raised = self.linger_ms + self.request_timeout_ms
            ClientLogger(log, self.client_id).warning(
                "delivery_timeout_ms raised from its default to linger_ms + request_timeout_ms (%d)", raised
            )
            object.__setattr__(self, "delivery_timeout_ms", raised)
        if self.delivery_timeout_ms < self.linger_ms + self.request_timeout_ms:
            raise ConfigError(
                f"delivery_timeout_ms ({self.delivery_timeout_ms}) must be at least "
                f"linger_ms + request_timeout_ms ({self.linger_ms + self.request_timeout_ms}): lower "
                "request_timeout_ms with it (librdkafka's message.timeout.ms is delivery_timeout_ms here)"
            )
        self._check_security(explicit)
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
                if self.transactional_id is not None:
                    raise ConfigError(
                        "transactional_id needs idempotence, which conflicts with " + ", ".join(conflicts)
                    )
                if "enable_idempotence" in explicit:
                    raise ConfigError("enable_idempotence=True conflicts with " + ", ".join(conflicts))
                # Like the Java client: idempotence is only a default, so settings that cannot
                # have it turn it off instead of failing, said at Java's levels (librdkafka's
                # max.in.flight=1000000 spelled out is likely a port that did not mean it).
                notes = ClientLogger(log, self.client_id)
                report = notes.warning if self.max_in_flight_requests_per_connection > 5 else notes.info
                report(
                    "idempotence turned off by %s: a retry may write a record twice or out of order "
                    "(set enable_idempotence=False to say so, or change those options)",
                    ", ".join(conflicts),
                )
                object.__setattr__(self, "enable_idempotence", False)
        if self.transactional_id is not None:
            if not self.enable_idempotence:
                raise ConfigError("transactional_id needs idempotence: enable_idempotence=False conflicts with it")
            if self.transaction_timeout_ms < 1:
                raise ConfigError(f"transaction_timeout_ms must be >= 1, got {self.transaction_timeout_ms}")

    def _check_security(self, explicit: set[str]) -> None:
        protocol = self.security_protocol
        if protocol not in SECURITY_PROTOCOLS:
            raise ConfigError(
                f"security_protocol must be one of {', '.join(SECURITY_PROTOCOLS)}, got {protocol!r}"
                + _did_you_mean(protocol, SECURITY_PROTOCOLS)
            )
        tls, sasl = protocol in ("SSL", "SASL_SSL"), protocol.startswith("SASL_")
        for name in sorted(explicit):
            if name.startswith("ssl_") and not tls:
                raise ConfigError(f"{name} is set but security_protocol is {protocol}: TLS needs SSL or SASL_SSL")
            if name.startswith("sasl_") and not sasl:
                raise ConfigError(
                    f"{name} is set but security_protocol is {protocol}: SASL needs SASL_PLAINTEXT or SASL_SSL"
                )
        algorithm = self.ssl_endpoint_identification_algorithm.lower()
        if algorithm not in ("https", "", "none"):
            raise ConfigError(
                f"ssl_endpoint_identification_algorithm must be 'https' (verify the broker's hostname, the default) "
                f"or '' (do not), got {self.ssl_endpoint_identification_algorithm!r}"
            )
        object.__setattr__(self, "ssl_endpoint_identification_algorithm", "https" if algorithm == "https" else "")
        if tls:
            object.__setattr__(self, "tls_context", self._build_tls_context(explicit))
        if sasl:
            self._check_sasl()

    def _build_tls_context(self, explicit: set[str]) -> ssl.SSLContext:
        from aioprod.net.tls import build_ssl_context

        for name in ("ssl_ca_location", "ssl_certificate_location", "ssl_key_location"):
            path = getattr(self, name)
            if path is not None and os.path.isdir(path):
                raise ConfigError(f"{name}: {path!r} is a directory; give a PEM file")
            if path is not None and not os.path.isfile(path):
                hint = (
                    " (librdkafka's 'probe', the system's CAs, is what aioprod does without it: leave it out)"
                    if name == "ssl_ca_location" and path.strip().lower() == "probe"
                    else ""
                )
                raise ConfigError(f"{name}: no such file {path!r}{hint}")
        if self.ssl_key_location is not None and self.ssl_certificate_location is None:
            raise ConfigError("ssl_key_location is set without ssl_certificate_location (the client certificate)")
        if self.ssl_context is not None:
            ignored = sorted(name for name in explicit if name.startswith("ssl_") and name != "ssl_context")
            if ignored:
                raise ConfigError(
                    f"ssl_context is used as it is: {', '.join(ignored)} would be ignored; "
                    "set them on the context, or give the PEM options without ssl_context"
                )
            return self.ssl_context
        _check_utf8("ssl_key_password", self.ssl_key_password)
        return build_ssl_context(
            ca_location=self.ssl_ca_location,
            certificate_location=self.ssl_certificate_location,
            key_location=self.ssl_key_location,
            key_password=None if self.ssl_key_password is None else self.ssl_key_password.reveal(),
            check_hostname=self.ssl_endpoint_identification_algorithm == "https",
        )

    def _check_sasl(self) -> None:
        from aioprod.net.sasl import (
            OAUTHBEARER_LOGIN_MODULE,
            PLAIN_LOGIN_MODULE,
            SCRAM_LOGIN_MODULE,
            parse_jaas_config,
        )

        mechanism = self.sasl_mechanism
        if self.sasl_jaas_config is not None:
            try:
                jaas = parse_jaas_config(self.sasl_jaas_config.reveal())
            except ValueError as exc:
                raise ConfigError(f"sasl_jaas_config: {exc}") from exc
            implied = {PLAIN_LOGIN_MODULE: "PLAIN", OAUTHBEARER_LOGIN_MODULE: "OAUTHBEARER"}.get(jaas.module)
            if jaas.module == SCRAM_LOGIN_MODULE:
                if mechanism not in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                    raise ConfigError(
                        "sasl_jaas_config uses ScramLoginModule: set sasl_mechanism to SCRAM-SHA-256 or SCRAM-SHA-512"
                    )
            elif implied is None:
                raise ConfigError(
                    f"sasl_jaas_config: login module {jaas.module!r} is not supported; use "
                    f"{PLAIN_LOGIN_MODULE} or {SCRAM_LOGIN_MODULE} (for OAuth and Amazon MSK IAM, "
                    "set sasl_oauth_token_provider instead)"
                )
            elif implied == "OAUTHBEARER":
                raise ConfigError(
                    "sasl_jaas_config: for OAUTHBEARER set sasl_oauth_token_provider (a callable returning the token)"
                )
            elif mechanism not in (None, implied):
                raise ConfigError(f"sasl_jaas_config uses {jaas.module} but sasl_mechanism is {mechanism}")
            mechanism = mechanism or implied
            if jaas.options.get("tokenauth", "").lower() == "true":
                # Java sends it as a SCRAM extension, and the broker then checks a delegation token:
                # dropped, the token id logged in as a user and was refused as "invalid credentials".
                raise ConfigError(
                    'sasl_jaas_config: tokenauth="true" (a delegation token) is not supported; '
                    "log in with a SCRAM user's credentials"
                )
            for key, name in (("username", "sasl_username"), ("password", "sasl_password")):
                if key not in jaas.options:
                    raise ConfigError(f'sasl_jaas_config has no {key}="..." option')
                if getattr(self, name) is not None:
                    raise ConfigError(f"the SASL {key} is given twice: in {name} and in sasl_jaas_config")
            object.__setattr__(self, "sasl_username", jaas.options["username"])
            object.__setattr__(self, "sasl_password", Secret(jaas.options["password"]))
        if mechanism is None:
            raise ConfigError(
                f"sasl_mechanism is required with security_protocol {self.security_protocol}: "
                f"one of {', '.join(SASL_MECHANISMS)}"
            )
        if mechanism not in SASL_MECHANISMS:
            hint = _did_you_mean(mechanism, SASL_MECHANISMS)
            if mechanism == "GSSAPI":
                hint = " (Kerberos/GSSAPI is not supported)"
            elif mechanism == "AWS_MSK_IAM":
                hint = " (for Amazon MSK IAM use OAUTHBEARER with aioprod.net.auth.msk_iam_token_provider)"
            raise ConfigError(f"sasl_mechanism must be one of {', '.join(SASL_MECHANISMS)}, got {mechanism!r}{hint}")
        object.__setattr__(self, "sasl_mechanism", mechanism)
        for name in ("sasl_username", "sasl_password"):
            _check_utf8(name, getattr(self, name))
        if mechanism == "OAUTHBEARER":
            if self.sasl_oauth_token_provider is None:
                raise ConfigError("sasl_mechanism OAUTHBEARER needs sasl_oauth_token_provider (a callable)")
            if self.sasl_username is not None or self.sasl_password is not None:
                raise ConfigError("sasl_username/sasl_password are not used by OAUTHBEARER; remove them")
        else:
            if self.sasl_username is None or self.sasl_password is None:
                raise ConfigError(f"sasl_mechanism {mechanism} needs sasl_username and sasl_password")
            if self.sasl_oauth_token_provider is not None:
                raise ConfigError(f"sasl_oauth_token_provider is only used by OAUTHBEARER, not {mechanism}")


def _check_utf8(name: str, value: str | Secret | None) -> None:
    """A credential must encode as UTF-8 (as it is sent); the message never quotes it."""
    text = value.reveal() if isinstance(value, Secret) else value
    if text is None:
        return
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise ConfigError(
            f"{name} is not valid text: character {exc.start + 1} is an unpaired surrogate (bytes that are not "
            "UTF-8, read from a file, the environment or the command line with surrogateescape?)"
        ) from None


def _did_you_mean(value: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(value.upper(), list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


_FIELDS = {f.name: f for f in dataclasses.fields(ProducerConfig) if f.name != "tls_context"}
_SECRET_FIELDS = {name for name, f in _FIELDS.items() if f.type == "Secret | None"}
_STRING_FIELDS = {
    "ssl_ca_location",
    "ssl_certificate_location",
    "ssl_key_location",
    "sasl_username",
    "sasl_mechanism",
}
_INT_FIELDS = {
    name for name, f in _FIELDS.items() if f.type in ("int", "int | None") and name not in ("acks", "compression_level")
}
_BOOL_FIELDS = {name for name, f in _FIELDS.items() if f.type == "bool"}


def check_option(name: str, value: Any) -> str:
    """One option's canonical (snake_case) name, after checking its name and value on their own.

    For tools that gather options from several places and want to say which one is wrong;
    rules that relate options to each other are checked by :meth:`ProducerConfig.from_options`.
    """
    if _what_aioprod_does(name, value):
        return snake_name(name)
    canonical = _canonical_name(name)
    _coerce(canonical, value)
    return canonical


#: Families of Java client options aioprod does not implement, by name prefix.
_UNSUPPORTED_PREFIXES = {
    "sasl_login_": _JAVA_OPTION,
    "sasl_oauthbearer_": (
        "a Java OAuth login option: give aioprod a sasl_oauth_token_provider (a callable returning the token)"
    ),
    "sasl_kerberos_": "a Kerberos option (GSSAPI is not supported)",
    "ssl_keystore_": _KEYSTORE_OPTION,
    "ssl_truststore_": _KEYSTORE_OPTION,
    "ssl_keymanager_": _JAVA_OPTION,
    "ssl_trustmanager_": _JAVA_OPTION,
    "partitioner_": (
        "a Java partitioner option aioprod does not implement (its partitioner option takes a name or a callable)"
    ),
}


def _unsupported(name: str) -> str | None:
    """Why aioprod does not implement the Kafka client option ``name`` (snake_case), or None."""
    if name in UNSUPPORTED_OPTIONS:
        return UNSUPPORTED_OPTIONS[name]
    return next((why for prefix, why in _UNSUPPORTED_PREFIXES.items() if name.startswith(prefix)), None)


#: Java's per-codec level options (KIP-390): the one of compression_type is compression_level.
_CODEC_LEVELS = {f"compression_{codec}_level": codec for codec in ("gzip", "lz4", "zstd")}
#: The compression level options, each of which None leaves unset.
_LEVEL_FIELDS = {"compression_level", *_CODEC_LEVELS}


#: Options of other clients at the values that ask for what aioprod always does: a ported
#: configuration that spells them out is taken as it is; other values are refused by name.
_ALWAYS_SO: dict[str, set[object]] = {
    # aiokafka's default ('auto' up to 0.12; None, a no-op, since 0.13): negotiate with each broker
    "api_version": {"auto", "none"},
    "api_version_request": {True, "true"},  # librdkafka's default
    "socket_nagle_disable": {True, "true"},
    "socket_keepalive_enable": {False, "false"},  # librdkafka's default: aioprod sets no SO_KEEPALIVE
    "enable_ssl_certificate_verification": {True, "true"},  # librdkafka's default
    "metadata_recovery_strategy": {"rebootstrap"},  # Java 4's and librdkafka's default
    "client_dns_lookup": {"use_all_dns_ips"},  # Java's default: every resolved address is tried
}


def _what_aioprod_does(raw: object, value: Any) -> bool:
    wanted = _ALWAYS_SO.get(snake_name(raw)) if isinstance(raw, str) else None
    return wanted is not None and (value if isinstance(value, bool) else str(value).strip().lower()) in wanted


def snake_name(raw: str) -> str:
    """An option's name as aioprod spells it: ``linger.ms``, ``Linger-MS`` and ``linger_ms`` alike."""
    return raw.strip().replace(".", "_").replace("-", "_").lower()


def _canonical_name(raw: str) -> str:
    if not isinstance(raw, str):
        raise ConfigError(f"option names must be strings, got {raw!r}")
    name = snake_name(raw)
    if name in _ALIASES:
        alias = _ALIASES[name]
        if alias is None:
            raise UnsupportedOptionError(f"option {raw!r} is not supported; use buffer_memory (bytes)", option=raw)
        name = alias
    if name not in _FIELDS and name not in _CODEC_LEVELS:
        why = _unsupported(name)
        if why is not None:
            raise UnsupportedOptionError(f"option {raw!r} is {why}", option=raw)
        close = difflib.get_close_matches(name, list(_FIELDS), n=1)
        # Answer in the spelling asked: a dotted (Java) name gets a dotted suggestion.
        suggestion = close[0].replace("_", ".") if close and "." in raw else (close[0] if close else "")
        hint = f" (did you mean {suggestion!r}?)" if close else ""
        raise ConfigError(f"unknown option {raw!r}{hint}")
    return name


#: A Java class name, as a Java client.properties gives a serializer.
_JAVA_CLASS = re.compile(r"[A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)+")


def _coerce(name: str, value: Any) -> Any:
    """Accept the string forms a command line or properties file would give."""
    if name == "bootstrap_servers":
        return parse_bootstrap_servers(value)
    if isinstance(value, str) and name not in _SECRET_FIELDS:
        value = value.strip()  # as Java's ConfigDef.parseType: "acks=all " from a .properties file
    if name == "acks":
        if isinstance(value, bool):  # True == 1: "acknowledge" would mean acks=1, and no idempotence
            raise ConfigError(f"acks must be 'all', -1, 0 or 1, got {value!r}")
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
    if name in _INT_FIELDS or name in _LEVEL_FIELDS:
        if value is None and name in _LEVEL_FIELDS:
            return None  # not set
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
        if callable(value):
            _check_partitioner_signature(value)
            return value
        if isinstance(value, str):
            return value
        raise ConfigError(f"partitioner must be a name or a callable, got {value!r}")
    if name == "telemetry":
        return _telemetry(value)
    if name in ("key_serializer", "value_serializer") and isinstance(value, str) and _JAVA_CLASS.fullmatch(value):
        # key.serializer=org.apache.kafka.common.serialization.StringSerializer, from a Java file
        raise UnsupportedOptionError(
            f"option {name!r} names a Java class ({value}): give aioprod a callable", option=name
        )
    if name in ("key_serializer", "value_serializer", "statistics_callback"):
        if value is not None and not callable(value):
            raise ConfigError(f"{name} must be callable, got {value!r}")
        return value
    if name in _SECRET_FIELDS:
        if value is None or isinstance(value, Secret):
            return value
        if not isinstance(value, str):
            raise ConfigError(f"{name} must be a string, got a {type(value).__name__}")
        return Secret(value)
    if name in _STRING_FIELDS:
        if value is None:
            return None
        if name.endswith("_location") and isinstance(value, os.PathLike):
            value = os.fspath(value)  # a pathlib.Path, as ssl.SSLContext takes it
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{name} must be a non-empty string, got {value!r}")
        return value.strip().upper() if name == "sasl_mechanism" else value
    if name == "ssl_endpoint_identification_algorithm":
        if value is None:  # not set (docs/security.md): the default, verify; "" or "none" turn it off
            return "https"
        if not isinstance(value, str):
            raise ConfigError(f"{name} must be 'https' or '', got {value!r}")
        return value.strip()
    if name == "ssl_context":
        if value is not None and not isinstance(value, ssl.SSLContext):
            raise ConfigError(f"ssl_context must be an ssl.SSLContext, got {type(value).__name__}")
        return value
    if name == "sasl_oauth_token_provider":
        if value is not None and not callable(value):
            hint = (
                " (an aiokafka AbstractTokenProvider? give a callable, sync or async, returning "
                "(token, expires_at in seconds since the epoch): aioprod refreshes the token by its expiry)"
                if callable(getattr(value, "token", None))
                else ""
            )
            raise ConfigError(f"sasl_oauth_token_provider must be callable, got {type(value).__name__}{hint}")
        return value
    if name in ("client_id", "security_protocol", "transactional_id"):
        if value is None and name == "transactional_id":
            return None
        if value is None and name == "security_protocol":  # not set: the default
            return "PLAINTEXT"
        if not isinstance(value, str) or (name == "transactional_id" and not value):
            raise ConfigError(f"{name} must be a non-empty string, got {value!r}")
        return value.strip().upper() if name == "security_protocol" else value
    return value


def _check_partitioner_signature(value: Any) -> None:
    """An aiokafka partitioner takes three arguments too, in another order and meaning: called
    as aioprod's, it got the topic as its key and the key's bytes as the partition list."""
    if type(value).__module__.startswith("aiokafka."):
        raise ConfigError(
            f"partitioner {type(value).__name__} is aiokafka's: aioprod's default partitioner already hashes "
            "keys with murmur2 as aiokafka's does; remove it"
        )
    try:
        names = tuple(inspect.signature(value).parameters)
    except (TypeError, ValueError):
        return
    # aiokafka's are (key, all_partitions, available), which its docs spell (key_bytes,
    # all_partitions, available_partitions); aioprod's are (topic, key, partitions).
    if any(n.startswith("all_partition") for n in names) and any(n.startswith("available") for n in names):
        raise ConfigError(
            "partitioner takes aiokafka's arguments (key, all_partitions, available); aioprod calls "
            "partitioner(topic, key, partitions) and uses the partition id it returns"
        )


def _telemetry(value: Any) -> Any:
    """``True``, or an :class:`aioprod.tracing.Telemetry`: OpenTelemetry, which must be installed."""
    if value is None or value is False:
        return None
    from aioprod.tracing import Telemetry, opentelemetry_missing

    if value is True:
        value = Telemetry()
    elif not isinstance(value, Telemetry):
        raise ConfigError(f"telemetry must be True or an aioprod.tracing.Telemetry, got {type(value).__name__}")
    missing = opentelemetry_missing()
    if missing:
        raise ConfigError(f"telemetry needs {missing}")
    return value


def parse_bootstrap_servers(value: Any) -> tuple[tuple[str, int], ...]:
    """``"h1:9092,h2:9093"`` or a list of ``"host:port"`` → ((host, port), ...). A listener
    name before ``://`` (``SASL_SSL://h:9092``, as Kafka's own configs write it) is dropped;
    an IPv6 address needs its brackets (``[::1]:9092``); a host alone is on port 9092."""
    items: Sequence[Any]
    if isinstance(value, str):
        items = [part for part in value.split(",") if part.strip()]
    elif isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        items = value
    else:
        raise ConfigError(f"bootstrap_servers must be 'host:port[,host:port]', got {value!r}")
    servers = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"bootstrap_servers entry must be 'host:port', got {item!r}")
        text = item.strip()
        if any(c.isspace() for c in text):
            raise ConfigError(f"bootstrap_servers entry {item!r} has spaces in it: separate entries with commas")
        if ";" in text:
            raise ConfigError(f"bootstrap_servers entry {item!r} has a ';' in it: separate entries with commas")
        scheme, sep, rest = text.partition("://")
        if sep and scheme.replace("_", "").isalnum():
            text = rest
        if text and (":" not in text or (text.startswith("[") and text.endswith("]"))):
            text = f"{text}:{DEFAULT_PORT}"  # as aiokafka and librdkafka take a host alone
        host, sep, port_text = text.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]  # an IPv6 literal
        elif ":" in host:
            raise ConfigError(
                f"bootstrap_servers entry {item!r} is not 'host:port' (an IPv6 address goes in brackets: '[::1]:9092')"
            )
        if not sep or not host or not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 65536:
            raise ConfigError(f"bootstrap_servers entry must be 'host:port', got {item!r}")
        if ":" not in host:  # not an IPv6 literal: a name the resolver must be able to take
            try:
                host.encode("idna")
            except UnicodeError as exc:
                raise ConfigError(f"bootstrap_servers entry {item!r} has no valid host name: {exc}") from None
        servers.append((host, int(port_text)))
    if not servers:
        raise ConfigError("bootstrap_servers is empty")
    return tuple(servers)
