"""Configuration: names, defaults, coercion and every mistake named at construction."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiokafka.partitioner import DefaultPartitioner  # type: ignore[import-untyped]

from aioprod import Producer
from aioprod.certs import CertificateAuthority
from aioprod.config import ProducerConfig
from aioprod.errors import ConfigError, KafkaError, UnsupportedOptionError


class _AiokafkaStyleTokenProvider:
    """aiokafka's sasl_oauth_token_provider: an object with an async token() returning a str."""

    async def token(self) -> str:
        return "t"


def test_java_4_defaults() -> None:
    c = ProducerConfig.from_options(bootstrap_servers="h:9092")
    assert c.bootstrap_servers == (("h", 9092),)
    assert (c.acks, c.linger_ms, c.batch_size, c.buffer_memory) == (-1, 5, 16384, 32 * 1024 * 1024)
    assert (c.max_block_ms, c.request_timeout_ms, c.delivery_timeout_ms) == (60_000, 30_000, 120_000)
    assert (c.retry_backoff_ms, c.retry_backoff_max_ms, c.metadata_max_age_ms) == (100, 1000, 300_000)
    assert (c.max_in_flight_requests_per_connection, c.max_request_size) == (5, 1024 * 1024)
    assert c.enable_idempotence is True


def test_a_host_without_a_port_is_on_9092_as_aiokafka_and_librdkafka_take_it() -> None:
    config = ProducerConfig.from_options(bootstrap_servers="kafka1,kafka2:9093,[::1],SSL://kafka3")
    assert config.bootstrap_servers == (("kafka1", 9092), ("kafka2", 9093), ("::1", 9092), ("kafka3", 9092))


@pytest.mark.parametrize("codec", ["none", "gzip", "lz4", "snappy"])
def test_librdkafkas_compression_level_minus_1_is_the_codecs_own(codec: str) -> None:
    config = ProducerConfig.from_options({"compression.level": -1, "compression.type": codec}, bootstrap_servers="h:1")
    assert config.compression_level is None


def test_zstd_keeps_its_level_minus_1() -> None:
    # A zstd level (fast), which the rule above took for librdkafka's "the codec's own".
    config = ProducerConfig.from_options(bootstrap_servers="h:1", compression_type="zstd", compression_level=-1)
    assert config.compression_level == -1


def test_none_is_an_options_default_whatever_its_type() -> None:
    # aiokafka's documented defaults, spelled out by a port: compression_type=None was a
    # ConfigError ("must be a string").
    ported = ProducerConfig.from_options(
        bootstrap_servers="h:1", compression_type=None, linger_ms=None, acks=None, client_id=None
    )
    assert ported == ProducerConfig.from_options(bootstrap_servers="h:1")
    with pytest.raises(ConfigError, match="bootstrap_servers is required"):
        ProducerConfig.from_options(bootstrap_servers=None)


def test_dotted_and_snake_names_mean_the_same() -> None:
    dotted = ProducerConfig.from_options(
        {"bootstrap.servers": "a:1,b:2", "linger.ms": "7", "compression.type": "LZ4", "acks": "all"}
    )
    snake = ProducerConfig.from_options(bootstrap_servers=["a:1", "b:2"], linger_ms=7, compression_type="lz4")
    assert dotted == snake
    assert dotted.bootstrap_servers == (("a", 1), ("b", 2))


def test_librdkafka_aliases() -> None:
    c = ProducerConfig.from_options({"metadata.broker.list": "h:1", "queue.buffering.max.ms": 9})
    assert c.linger_ms == 9
    c = ProducerConfig.from_options({"bootstrap.servers": "h:1", "message.send.max.retries": 3})
    assert c.retries == 3


def test_config_is_frozen() -> None:
    c = ProducerConfig.from_options(bootstrap_servers="h:1")
    with pytest.raises(AttributeError):
        c.linger_ms = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"bootstrap_servers": "h:1", "lingr_ms": 5}, "unknown option 'lingr_ms' (did you mean 'linger_ms'?)"),
        ({"bootstrap_servers": "h:1", "lingr.ms": 5}, "unknown option 'lingr.ms' (did you mean 'linger.ms'?)"),
        ({"bootstrap_servers": "h:1", "linger_ms": -1}, "linger_ms must be >= 0, got -1"),
        ({"bootstrap_servers": "h:1", "batch_size": 0}, "batch_size must be >= 1"),
        (  # nothing would ever be sent
            {"bootstrap_servers": "h:1", "max_in_flight_requests_per_connection": 0},
            "max_in_flight_requests_per_connection must be >= 1",
        ),
        ({"bootstrap_servers": "h:1", "linger_ms": True}, "linger_ms must be an integer, got True"),
        ({"bootstrap_servers": "h:1", "linger_ms": 1.5}, "linger_ms must be an integer, got 1.5"),  # not cut to 1
        ({"bootstrap_servers": "h:1", "client_id": "\u00e9" * 20_000}, "client_id must be at most 32767 bytes"),
        ({"bootstrap_servers": "h:1", "linger_ms": "soon"}, "linger_ms must be an integer"),
        ({"bootstrap_servers": "h:1", "acks": 2}, "acks must be"),
        ({"bootstrap_servers": "h:1", "compression_type": "brotli"}, "compression_type must be one of"),
        ({"bootstrap_servers": "h:1", "enable_idempotence": "yes"}, "enable_idempotence must be true or false"),
        ({"bootstrap_servers": "h:"}, "bootstrap_servers entry must be 'host:port'"),
        ({"bootstrap_servers": "h:99999"}, "bootstrap_servers entry must be 'host:port'"),
        ({"bootstrap_servers": "h:9²"}, "bootstrap_servers entry must be 'host:port'"),  # a digit int() refuses
        ({"bootstrap_servers": "[::1]:⁹⁰⁹²"}, "bootstrap_servers entry must be 'host:port'"),
        ({"bootstrap_servers": "kafka..example.com:9092"}, "has no valid host name"),
        ({"bootstrap_servers": "::1"}, "an IPv6 address goes in brackets"),
        ({"bootstrap_servers": "h:9092:9093"}, "is not 'host:port'"),
        ({"bootstrap_servers": "h:9092 h2:9093"}, "separate entries with commas"),
        ({"bootstrap_servers": b"h:9092"}, "bootstrap_servers must be 'host:port[,host:port]', got b'h:9092'"),
        (
            {"bootstrap_servers": "h:1", "request_timeout_ms": 2**31, "delivery_timeout_ms": 2**40},
            "request_timeout_ms must be <= 2147483647",
        ),
        (
            {"bootstrap_servers": "h:1", "transactional_id": "t", "transaction_timeout_ms": 2**32},
            "transaction_timeout_ms must be <= 2147483647",
        ),
        ({"bootstrap_servers": "h:1", "batch_size": 2**31}, "batch_size must be <= 2147483647"),
        ({"bootstrap_servers": "h:1", "client_id": "x" * 40_000}, "client_id must be at most 32767 bytes"),
        (
            {"bootstrap_servers": "h:1", "transactional_id": "x" * 40_000},
            "transactional_id must be at most 32767 bytes",
        ),
        # A lone surrogate (argv or a file read with surrogateescape) has no UTF-8 form: it raised
        # UnicodeEncodeError, naming no option (the CLI printed it as its whole error).
        ({"bootstrap_servers": "h:1", "client.id": "app-\udcff"}, "client_id is not valid text: character 5"),
        ({"bootstrap_servers": "h:1", "transactional_id": "\udcfftx"}, "transactional_id is not valid text"),
        (
            {"bootstrap_servers": "h:1", "compression_type": "gzip", "compression_level": 100},
            r"compression_level: gzip levels are 1 to 9, got 100",
        ),
        ({"bootstrap_servers": "h:1", "compression_type": "snappy", "compression_level": 1}, "snappy has no"),
        ({}, "bootstrap_servers is required"),
        ({"bootstrap_servers": "h:1", "partitioner": "random"}, "partitioner must be one of"),
        (
            {"bootstrap_servers": "h:1", "delivery_timeout_ms": 1000},
            "delivery_timeout_ms (1000) must be at least linger_ms + request_timeout_ms",
        ),
        (
            {"bootstrap_servers": "h:1", "retry_backoff_ms": 500, "retry_backoff_max_ms": 100},
            "retry_backoff_max_ms (100) is below retry_backoff_ms (500)",
        ),
        (
            {"bootstrap_servers": "h:1", "enable_idempotence": True, "acks": 1},
            "enable_idempotence=True conflicts with acks=1",
        ),
        (
            {"bootstrap_servers": "h:1", "enable_idempotence": True, "max_in_flight_requests_per_connection": 6},
            "max_in_flight_requests_per_connection=6",
        ),
        ({"bootstrap_servers": "h:1", "security_protocol": "SASL_SSL"}, "sasl_mechanism is required"),
        ({"bootstrap_servers": "h:1", "security_protocol": "TLS"}, "security_protocol must be one of"),
        ({"bootstrap_servers": "h:1", "transactional_id": "tx-1", "acks": 1}, "transactional_id needs idempotence"),
        ({"bootstrap_servers": "h:1", "transactional_id": "tx-1", "transaction_timeout_ms": 0}, "must be >= 1"),
        ({"bootstrap_servers": "h:1", "key_serializer": "json"}, "key_serializer must be callable"),
        ({"bootstrap_servers": "h:1", "metrics_num_samples": 0}, "metrics_num_samples must be >= 1"),
        ({"bootstrap_servers": "h:1", "metrics.sample.window.ms": 0}, "metrics_sample_window_ms must be >= 1"),
        (
            {"bootstrap_servers": "h:1", "statistics.interval.ms": 1000},
            "statistics_interval_ms is set but statistics_callback is not",
        ),
        ({"bootstrap_servers": "h:1", "stats_cb": print}, "statistics_callback needs statistics_interval_ms > 0"),
        ({"bootstrap_servers": "h:1", "statistics_callback": 5}, "statistics_callback must be callable"),
        ({"bootstrap_servers": "a:9092;b:9092"}, "has a ';' in it: separate entries with commas"),
        (
            {"bootstrap_servers": "h:1", "sasl_oauth_token_provider": _AiokafkaStyleTokenProvider()},
            "an aiokafka AbstractTokenProvider? give a callable",
        ),
    ],
)
def test_bad_options_fail_at_construction_naming_the_option(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Producer(**options)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, KafkaError)


def test_same_option_twice_is_refused_naming_both_spellings() -> None:
    # It said "given twice (as 'linger_ms')", one spelling twice over.
    with pytest.raises(ConfigError, match=r"^option 'linger_ms' given twice: as 'linger\.ms' and as 'linger_ms'$"):
        Producer({"linger.ms": 1}, bootstrap_servers="h:1", linger_ms=2)


@pytest.mark.parametrize("value", [0, "0"])
def test_librdkafkas_message_timeout_of_zero_is_refused_saying_what_it_meant(value: object) -> None:
    # It said "delivery_timeout_ms must be >= 1, got 0": neither the option given nor why.
    with pytest.raises(ConfigError, match=r"^message\.timeout\.ms=0 is librdkafka's 'no limit'.*e\.g\. 3600000"):
        Producer({"bootstrap.servers": "h:1", "message.timeout.ms": value})
    with pytest.raises(ConfigError, match=r"^delivery_timeout_ms must be >= 1, got 0$"):
        Producer({"bootstrap.servers": "h:1", "delivery.timeout.ms": value})


def test_idempotence_is_a_default_that_yields_to_explicit_acks() -> None:
    # As in the Java client: without an explicit enable_idempotence, acks=1 turns it off.
    assert ProducerConfig.from_options(bootstrap_servers="h:1", acks=1).enable_idempotence is False


def test_listener_names_and_ipv6_brackets_in_bootstrap_servers() -> None:
    config = ProducerConfig.from_options(bootstrap_servers="SASL_SSL://h:9092, PLAINTEXT://[::1]:9093")
    assert config.bootstrap_servers == (("h", 9092), ("::1", 9093))


@pytest.mark.parametrize("options", ["localhost:9092", ["localhost:9092"]])
def test_a_positional_argument_that_is_not_a_mapping_is_a_config_error(options: object) -> None:
    with pytest.raises(ConfigError, match=r"a mapping of options.*\(bootstrap_servers=\.\.\.\?\)"):
        ProducerConfig.from_options(options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "what"),
    [
        ("session.timeout.ms", "is a consumer option (aioprod is a producer)"),
        ("client.dns.lookup", "is a Java client option aioprod does not implement"),
        ("schema.registry.url", "is a Schema Registry option"),
        ("ssl.truststore.location", "give PEM files in ssl_ca_location"),
        ("sasl.login.connect.timeout.ms", "is a Java client option aioprod does not implement"),
        ("sasl.oauthbearer.token.endpoint.url", "give aioprod a sasl_oauth_token_provider"),
        ("partitioner.class", "is a Java partitioner option"),
        # A Java client.properties (MSK's has client.rack) got "did you mean 'client.id'?", and
        # aioprod -F refused the whole file instead of skipping the line.
        ("client.rack", "is a consumer option (aioprod is a producer)"),
        ("group.protocol", "is a consumer option (aioprod is a producer)"),
        ("default.api.timeout.ms", "is a consumer option (aioprod is a producer)"),
        ("check.crcs", "is a consumer option (aioprod is a producer)"),
        ("exclude.internal.topics", "is a consumer option (aioprod is a producer)"),
        ("group.remote.assignor", "is a consumer option (aioprod is a producer)"),
        ("api_version", "aioprod negotiates each request's version with the broker"),
        # Not an alias of metadata_max_age_ms: a librdkafka config may set both, meaning different things.
        ("topic.metadata.refresh.interval.ms", "give metadata_max_age_ms, Java's name for it"),
        ("enable.ssl.certificate.verification", "aioprod always verifies the broker's certificate chain"),
        # confluent-kafka's and librdkafka's: "unknown option", with no word of what to do instead.
        ("error_cb", "aioprod raises errors from its calls and records' futures"),
        ("on_delivery", "add a callback to each record's future"),
        ("logger", "logger 'aioprod'"),
        ("debug", "set the 'aioprod' logger to DEBUG"),
        ("queue.buffering.max.messages", "buffer_memory"),
        ("batch.num.messages", "batch_size"),
        ("api.version.request", "aioprod always asks the broker for its API versions"),
        ("socket.nagle.disable", "always disable Nagle's algorithm"),
        # The rest of librdkafka's own: "unknown option", some with a misleading "did you mean".
        ("ssl.key.pem", "write it to a file and give its path"),
        ("ssl_ca", "write it to a file and give its path"),
        ("dr_msg_cb", "each record's future tells its outcome"),
        ("socket.timeout.ms", "request_timeout_ms bounds each request"),
        ("enabled_events", "a librdkafka option aioprod does not implement"),
        ("topic.metadata.propagation.max.ms", "a librdkafka option aioprod does not implement"),
        # librdkafka's deprecated ones, in older confluent-kafka configurations: "unknown option
        # 'socket.blocking.max.ms' (did you mean 'retry.backoff.max.ms'?)", and
        # "unknown option 'ssl.engine.location' (did you mean 'ssl.key.location'?)".
        ("socket.blocking.max.ms", "a deprecated librdkafka option"),
        ("ssl.engine.location", "a deprecated librdkafka option (an OpenSSL engine"),
        ("reconnect.backoff.jitter.ms", "a deprecated librdkafka option"),
        ("topic.metadata.refresh.fast.cnt", "a deprecated librdkafka option"),
        ("api.version.fallback.ms", "a deprecated librdkafka option"),
        ("produce.offset.report", "a deprecated librdkafka option"),
        ("queuing.strategy", "a deprecated, experimental librdkafka option"),
        ("msg_order_cmp", "a deprecated, experimental librdkafka option"),
        ("partitioner_cb", "give aioprod's partitioner option a callable"),  # was: "a Java partitioner option"
        ("transaction.two.phase.commit.enable", "prepare_transaction() needs no option"),  # Java's (KIP-939)
    ],
)
def test_a_kafka_option_aioprod_does_not_implement_is_named_not_mistaken_for_a_typo(name: str, what: str) -> None:
    with pytest.raises(UnsupportedOptionError) as info:
        Producer(bootstrap_servers="h:1", **{name: "1"})
    assert str(info.value).startswith(f"option {name!r} ") and what in str(info.value)
    assert "did you mean" not in str(info.value)
    assert info.value.option == name


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("api_version", "auto"),
        ("api.version", "AUTO"),
        ("api_version", None),  # aiokafka 0.13's default, a no-op
        ("api.version.request", True),
        ("api.version.request", "true"),
        ("socket.nagle.disable", "True"),
        ("socket.keepalive.enable", "false"),  # librdkafka's default (no SO_KEEPALIVE), as aioprod's
        ("socket.keepalive.enable", False),
    ],
)
def test_another_clients_option_asking_for_what_aioprod_does_is_taken(name: str, value: object) -> None:
    # aiokafka's and librdkafka's defaults, which a ported configuration may spell out; other
    # values are refused above.
    assert ProducerConfig.from_options({name: value}, bootstrap_servers="h:1") == ProducerConfig.from_options(
        bootstrap_servers="h:1"
    )


@pytest.mark.parametrize(
    "partitioner",
    [
        DefaultPartitioner(),
        lambda key, all_partitions, available: all_partitions[-1],
        lambda key_bytes, all_partitions, available_partitions: all_partitions[-1],  # as aiokafka's docs name them
    ],
    ids=["aiokafka's DefaultPartitioner", "aiokafka's arguments", "aiokafka's documented names"],
)
def test_an_aiokafka_partitioner_is_refused_not_called_with_other_arguments(partitioner: object) -> None:
    # Three arguments too, in another order: called as aioprod's, it got the topic as its key
    # and the key's bytes as the partition list, and placed records wherever that led.
    with pytest.raises(ConfigError, match="aiokafka"):
        ProducerConfig.from_options(bootstrap_servers="h:1", partitioner=partitioner)
    assert ProducerConfig.from_options(bootstrap_servers="h:1", partitioner=lambda topic, key, partitions: 0)


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("lingr_ms", "linger_ms"),
        ("linger.mss", "linger.ms"),
        ("bootstrap", "bootstrap_servers"),
        ("idempotent", "enable_idempotence"),
    ],
)
def test_a_typo_still_gets_a_suggestion(typo: str, meant: str) -> None:
    with pytest.raises(ConfigError, match=f"did you mean {meant!r}"):
        Producer(bootstrap_servers="h:1", **{typo: "1"})


@pytest.mark.parametrize("name", ["key.serializer", "value_serializer"])
def test_a_java_serializer_class_is_an_unsupported_option_in_the_library_too(name: str) -> None:
    java_class = "org.apache.kafka.common.serialization.StringSerializer"
    with pytest.raises(UnsupportedOptionError, match=f"names a Java class \\({java_class}\\): give aioprod a callable"):
        Producer(bootstrap_servers="h:1", **{name: java_class})


@pytest.mark.parametrize("value", [True, False])
def test_acks_refuses_a_bool(value: bool) -> None:
    # True == 1 in Python: acks=True was acks=1, which also turned idempotence off.
    with pytest.raises(ConfigError, match="acks must be 'all', -1, 0 or 1, got"):
        Producer(bootstrap_servers="127.0.0.1:9092", acks=value)


@pytest.mark.parametrize(
    "options",
    [
        {"ssl_context": None},
        {"ssl_ca_location": None},
        {"sasl_mechanism": None},
        {"sasl_username": None, "sasl_password": None},
        {"sasl_oauth_token_provider": None},
        {"ssl_context": None, "sasl_mechanism": None, "sasl_plain_username": None, "sasl_plain_password": None},
    ],
)
def test_a_security_option_passed_as_none_is_not_set(options: dict[str, object]) -> None:
    # Code moving from aiokafka passes its settings through, None meaning unset: "ssl_context is
    # set but security_protocol is PLAINTEXT".
    assert ProducerConfig.from_options(bootstrap_servers="127.0.0.1:9092", **options).security_protocol == "PLAINTEXT"


@pytest.mark.parametrize(("codec", "level"), [("gzip", 9), ("lz4", 12), ("zstd", 10)])
def test_javas_compression_level_names(codec: str, level: int) -> None:
    # KIP-390's names in a Java client.properties were "unknown option".
    options = {"bootstrap.servers": "127.0.0.1:9092", "compression.type": codec, f"compression.{codec}.level": level}
    assert ProducerConfig.from_options(options).compression_level == level
    # Java takes every codec's level and uses the one of compression.type.
    other = {"bootstrap.servers": "127.0.0.1:9092", "compression.type": "snappy", f"compression.{codec}.level": level}
    assert ProducerConfig.from_options(other).compression_level is None


def test_javas_compression_level_names_are_checked_against_their_codec() -> None:
    with pytest.raises(ConfigError, match=r"^compression.gzip.level: gzip levels are 1 to 9, got 42$"):
        ProducerConfig.from_options(bootstrap_servers="127.0.0.1:9092", compression_gzip_level=42)
    with pytest.raises(ConfigError, match=r"compression_level and compression.zstd.level both set"):
        ProducerConfig.from_options(
            bootstrap_servers="127.0.0.1:9092", compression_type="zstd", compression_level=3, compression_zstd_level=5
        )


def test_a_directory_for_a_tls_file_says_so(tmp_path: Path) -> None:
    # It said "no such file '/etc/ssl/certs'" (librdkafka takes a directory of CAs there).
    with pytest.raises(ConfigError, match="is a directory; give a PEM file"):
        ProducerConfig.from_options(
            bootstrap_servers="127.0.0.1:9092", security_protocol="SSL", ssl_ca_location=tmp_path
        )


def test_librdkafkas_ssl_ca_location_probe_says_to_leave_it_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # librdkafka's "probe" (the system's CAs) said only "no such file 'probe'".
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ConfigError, match=r"no such file 'probe' \(librdkafka's 'probe', the system's CAs, is what aioprod"
    ):
        ProducerConfig.from_options(
            {"bootstrap.servers": "127.0.0.1:9092", "security.protocol": "SSL", "ssl.ca.location": "probe"}
        )


@pytest.mark.parametrize(
    "name", ["ssl.engine.location", "api.version.fallback.ms", "queuing.strategy", "msg_order_cmp"]
)
def test_a_deprecated_librdkafka_option_librdkafka_still_acts_on_is_not_said_to_be_unused(name: str) -> None:
    # "librdkafka no longer uses it either: remove it": librdkafka still loads ssl.engine.location's
    # OpenSSL engine (the client key in an HSM, say), still falls back for api.version.fallback.ms, and
    # still orders its queue by queuing.strategy/msg_order_cmp. Removing the engine loses the key.
    with pytest.raises(UnsupportedOptionError) as refused:
        ProducerConfig.from_options({"bootstrap.servers": "h:1", name: "x"})
    assert "no longer uses it" not in str(refused.value)
    if name == "ssl.engine.location":
        assert "ssl_key_location" in str(refused.value)


@pytest.mark.parametrize("options", [{"request.timeout.ms": 180_000}, {"linger.ms": 120_000}])
def test_a_default_delivery_timeout_follows_linger_and_request_timeout(options: dict[str, int]) -> None:
    # As Java's configureDeliveryTimeout: a Java config raising request.timeout.ms was refused
    # for a delivery timeout its user never set.
    config = ProducerConfig.from_options({"bootstrap.servers": "127.0.0.1:9092", **options})
    assert config.delivery_timeout_ms == config.linger_ms + config.request_timeout_ms
    with pytest.raises(ConfigError, match="delivery_timeout_ms"):  # one that was set still is
        ProducerConfig.from_options({"bootstrap.servers": "127.0.0.1:9092", "delivery.timeout.ms": 120_000, **options})


def test_none_for_hostname_verification_and_security_protocol_is_the_default(tmp_path: Path) -> None:
    # None turned hostname verification off, and security_protocol=None was refused, though a
    # security option given as None is not set (docs/security.md).
    ca = CertificateAuthority()
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(ca.cert_pem)
    tls = {"bootstrap_servers": "h:9093", "security_protocol": "SSL", "ssl_ca_location": ca_file}
    config = ProducerConfig.from_options(tls, ssl_endpoint_identification_algorithm=None)
    assert config.tls_context is not None and config.tls_context.check_hostname is True
    assert (
        ProducerConfig.from_options(bootstrap_servers="h:9092", security_protocol=None).security_protocol == "PLAINTEXT"
    )


def test_compression_level_none_beside_a_codec_level_is_not_set() -> None:
    options = {"bootstrap.servers": "h:9092", "compression.type": "gzip", "compression.gzip.level": 5}
    assert ProducerConfig.from_options(options, compression_level=None).compression_level == 5
    # ... nor is a per-codec level given as None (it said "must be an integer")
    none = {"bootstrap.servers": "h:9092", "compression.type": "gzip", "compression.gzip.level": None}
    assert ProducerConfig.from_options(none, compression_level=3).compression_level == 3


@pytest.mark.parametrize(
    "option",
    [
        {"retry.backoff.ms": 2000},  # a pre-KIP-580 Java config, or librdkafka's
        {"reconnect.backoff.ms": 2000},  # Java: a static backoff
        {"socket.connection.setup.timeout.ms": 60000},  # librdkafka has no *.max.ms option
    ],
)
def test_the_base_of_a_backoff_alone_raises_its_default_maximum(option: dict[str, int]) -> None:
    # Refused, naming a maximum the user never set: "retry_backoff_max_ms (1000) is below ...".
    config = ProducerConfig.from_options({"bootstrap.servers": "h:9092", **option})
    ((name, value),) = option.items()
    assert getattr(config, name.replace(".", "_").replace("_ms", "_max_ms")) == value


def test_a_backoff_maximum_set_below_its_base_is_still_refused() -> None:
    with pytest.raises(ConfigError, match=r"retry_backoff_max_ms \(1000\) is below"):
        ProducerConfig.from_options(bootstrap_servers="h:1", retry_backoff_ms=2000, retry_backoff_max_ms=1000)


@pytest.mark.parametrize(
    ("option", "level"),
    [({"acks": 1}, "INFO"), ({"retries": 0}, "INFO"), ({"max.in.flight": 1000000}, "WARNING")],
)
def test_idempotence_turned_off_by_another_option_is_said(
    option: dict[str, int], level: str, caplog: pytest.LogCaptureFixture
) -> None:
    # As Java does (INFO, or WARN for the in-flight count); it went without a word.
    caplog.set_level("DEBUG", logger="aioprod")
    config = ProducerConfig.from_options({"bootstrap.servers": "h:9092", **option})
    assert config.enable_idempotence is False
    assert [r.levelname for r in caplog.records if "idempotence turned off" in r.getMessage()] == [level]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("metadata.recovery.strategy", "rebootstrap"),  # Java 4's and librdkafka's default
        ("client.dns.lookup", "use_all_dns_ips"),  # Java's default
        ("enable.ssl.certificate.verification", "true"),  # librdkafka's default
    ],
)
def test_java_and_librdkafka_defaults_aioprod_does_are_taken(name: str, value: str) -> None:
    assert ProducerConfig.from_options({name: value}, bootstrap_servers="h:1") == ProducerConfig.from_options(
        bootstrap_servers="h:1"
    )


@pytest.mark.parametrize(
    "name",
    ["oauth_cb", "enable.partition.eof", "fetch.wait.max.ms", "queued.min.messages", "queue.buffering.max.kbytes"],
)
def test_confluent_and_librdkafka_options_are_named_not_guessed_at(name: str) -> None:
    # "unknown option 'enable.partition.eof'; did you mean 'partitioner'?"
    with pytest.raises(UnsupportedOptionError) as info:
        Producer(bootstrap_servers="h:1", **{name: "1"})
    assert "did you mean" not in str(info.value)


def test_confluents_oauth_cb_points_at_the_token_provider() -> None:
    with pytest.raises(UnsupportedOptionError, match="sasl_oauth_token_provider"):
        Producer(bootstrap_servers="h:1", oauth_cb=lambda config: ("token", 0.0))


@pytest.mark.parametrize("option", [{"acks": "all "}, {"enable.idempotence": " true"}, {"compression.type": "lz4 "}])
def test_string_values_are_trimmed_as_java_trims_them(option: dict[str, str]) -> None:
    ((name, value),) = option.items()
    assert ProducerConfig.from_options({name: value}, bootstrap_servers="h:1") == ProducerConfig.from_options(
        {name: value.strip()}, bootstrap_servers="h:1"
    )


@pytest.mark.parametrize("option", [{"ssl_endpoint_identification_algorithm": ""}, {"ssl_ca_location": __file__}])
def test_tls_options_given_with_an_ssl_context_are_refused(option: dict[str, str]) -> None:
    # They were dropped without a word: the hostname check stayed on, failing at the handshake.
    import ssl

    with pytest.raises(ConfigError, match="ssl_context is used as it is"):
        ProducerConfig.from_options(
            bootstrap_servers="h:1", security_protocol="SSL", ssl_context=ssl.create_default_context(), **option
        )


@pytest.mark.parametrize(
    "name", ["linger_ms", "max_block_ms", "delivery_timeout_ms", "reconnect_backoff_max_ms", "connections_max_idle_ms"]
)
def test_a_duration_beyond_javas_long_is_a_config_error(name: str) -> None:
    # It passed, then failed as an OverflowError in the constructor, at start(), or in a task.
    with pytest.raises(ConfigError, match=f"{name} must be <= {2**63 - 1}"):
        ProducerConfig.from_options(bootstrap_servers="h:1", **{name: 10**400})


@pytest.mark.parametrize("servers", ["h:1,", "h:1,,h2:2", " h:1 , h2:2 ,"])
def test_empty_entries_of_a_bootstrap_list_are_skipped(servers: str) -> None:
    # A list written by hand, ending in a comma or with one doubled: its empty entries are skipped.
    expected = (("h", 1),) if servers == "h:1," else (("h", 1), ("h2", 2))
    assert ProducerConfig.from_options(bootstrap_servers=servers).bootstrap_servers == expected
