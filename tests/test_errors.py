"""Broker error codes in :mod:`aioprod.errors` against the Kafka protocol reference table.

The reference is the pinned copy in ``tests/kafka_protocol/errors.tsv``, and the outside one
(``../shared/kafka-protocol`` or ``$AIOPROD_KAFKA_PROTOCOL_DIR``) too when present, so a newer
Kafka's table shows drift (see ``tests/kafka_reference.py``).
"""

from __future__ import annotations

import concurrent.futures
import copy
import functools
import inspect
import pickle
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioprod import errors
from aioprod.errors import (
    ERRORS_BY_CODE,
    BrokerResponseError,
    KafkaError,
    UnknownBrokerError,
    error_for_code,
)
from tests.kafka_reference import ENV_VAR, PINNED, reference_dirs

REPO_ROOT = Path(__file__).resolve().parent.parent
HEADER = ["code", "name", "retriable", "exception", "message"]

#: The client-side error tree; broker error classes must stay out of it.
CLIENT_SIDE = (
    errors.ConfigError,
    errors.ProtocolError,
    errors.CorruptRecordError,
    errors.UnsupportedVersionError,
    errors.KafkaConnectionError,
    errors.KafkaTimeoutError,
    errors.ProducerClosedError,
    errors.RecordTooLargeError,
    errors.PartitionNotFoundError,
    TimeoutError,
    ValueError,
    TypeError,
    ConnectionError,
)


@dataclass(frozen=True)
class RefRow:
    code: int
    name: str
    retriable: bool


REFERENCES = reference_dirs()


@pytest.fixture(params=list(REFERENCES))
def reference(request: pytest.FixtureRequest) -> Path:
    """The root of one protocol reference: the pinned copy, then the outside one if present."""
    return REFERENCES[request.param]


@functools.cache
def _load_reference(path: Path) -> tuple[RefRow, ...]:
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines and lines[0].split("\t") == HEADER, f"{path}: unexpected header {lines[:1]!r}"
    rows = []
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("\t")
        assert len(fields) == len(HEADER), f"{path}:{lineno}: expected {len(HEADER)} columns"
        assert fields[2] in ("yes", "no"), f"{path}:{lineno}: retriable must be yes/no"
        rows.append(RefRow(int(fields[0]), fields[1], fields[2] == "yes"))
    return tuple(rows)


def reference_rows(root: Path = PINNED) -> tuple[RefRow, ...]:
    """Every row of the reference's errors.tsv; fails (does not skip) the calling test if it is missing."""
    tsv = root / "errors.tsv"
    if not tsv.is_file():
        pytest.fail(f"Kafka protocol error table not found: {tsv} (from ${ENV_VAR})", pytrace=False)
    return _load_reference(tsv)


def error_rows(root: Path = PINNED) -> tuple[RefRow, ...]:
    """Reference rows that are errors (everything but code 0, NONE)."""
    return tuple(row for row in reference_rows(root) if row.code != 0)


def expected_class_name(protocol_name: str) -> str:
    """The documented naming rule, reimplemented independently of the generator."""
    words = protocol_name.split("_")
    if words[-1] in ("ERROR", "EXCEPTION"):
        words.pop()
    name = "".join(w[0] + w[1:].lower() for w in words) + "Error"
    client_side = {
        name
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and obj.__module__ == errors.__name__ and not issubclass(obj, BrokerResponseError)
    }
    return "Broker" + name if name in client_side else name


def module_broker_classes() -> dict[str, type[BrokerResponseError]]:
    return {
        name: obj for name, obj in vars(errors).items() if inspect.isclass(obj) and issubclass(obj, BrokerResponseError)
    }


# --- the table against the reference ------------------------------------------------------


def test_reference_has_none_and_is_sane(reference: Path) -> None:
    rows = reference_rows(reference)
    assert RefRow(0, "NONE", False) in rows
    assert len({row.code for row in rows}) == len(rows)
    assert len({row.name for row in rows}) == len(rows)


def test_module_table_matches_reference(reference: Path) -> None:
    table = [(code, name, retriable) for code, name, retriable, _, _ in errors._BROKER_ERROR_TABLE]
    expected = sorted((row.code, row.name, row.retriable) for row in error_rows(reference))
    assert table == expected


def test_every_reference_code_has_its_class(reference: Path) -> None:
    for row in error_rows(reference):
        assert row.code in ERRORS_BY_CODE, f"no class for {row.name} ({row.code})"
        cls = ERRORS_BY_CODE[row.code]
        assert cls.__name__ == expected_class_name(row.name)
        assert getattr(errors, cls.__name__) is cls, "class must be a real module attribute"
        assert cls.__module__ == "aioprod.errors"
        assert (cls.code, cls.name, cls.retriable) == (row.code, row.name, row.retriable)
        assert cls.__bases__ == (BrokerResponseError,)
        assert issubclass(cls, KafkaError)
        assert isinstance(cls.description, str) and cls.description


def test_no_extra_codes_or_classes(reference: Path) -> None:
    assert set(ERRORS_BY_CODE) == {row.code for row in error_rows(reference)}
    assert 0 not in ERRORS_BY_CODE
    classes = module_broker_classes()
    assert set(classes) == {cls.__name__ for cls in ERRORS_BY_CODE.values()} | {
        "BrokerResponseError",
        "UnknownBrokerError",
    }
    assert len(set(ERRORS_BY_CODE.values())) == len(ERRORS_BY_CODE)


def test_errors_by_code_is_read_only() -> None:
    with pytest.raises(TypeError):
        ERRORS_BY_CODE[999] = UnknownBrokerError  # type: ignore[index]


def test_known_examples() -> None:
    assert errors.NotLeaderOrFollowerError.code == 6
    assert errors.NotLeaderOrFollowerError.retriable is True
    assert errors.UnknownTopicOrPartitionError.code == 3
    assert errors.OutOfOrderSequenceNumberError.code == 45
    assert errors.DuplicateSequenceNumberError.code == 46
    assert errors.UnknownServerError.code == -1
    assert errors.UnknownServerError.retriable is False
    assert errors.NetworkError.name == "NETWORK_EXCEPTION"
    assert errors.BrokerUnsupportedVersionError.code == 35


def test_broker_errors_stay_out_of_client_side_tree() -> None:
    for cls in [BrokerResponseError, UnknownBrokerError, *ERRORS_BY_CODE.values()]:
        assert not issubclass(cls, CLIENT_SIDE), cls
    assert not issubclass(errors.RequestTimedOutError, TimeoutError)
    assert errors.RequestTimedOutError.retriable is True
    # The client-side classes are untouched.
    assert not issubclass(errors.UnsupportedVersionError, BrokerResponseError)
    assert not issubclass(errors.KafkaTimeoutError, BrokerResponseError)
    assert errors.KafkaTimeoutError.retriable is True
    assert issubclass(errors.KafkaTimeoutError, TimeoutError)


def test_generated_section_is_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "gen_error_classes.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


# --- error_for_code and the instances -------------------------------------------------------


def test_error_for_code_round_trips_every_code() -> None:
    for row in error_rows():
        err = error_for_code(row.code)
        assert type(err) is ERRORS_BY_CODE[row.code]
        assert (err.code, err.name, err.retriable, err.message) == (row.code, row.name, row.retriable, None)
        with_message = error_for_code(row.code, "broker says hi")
        assert type(with_message) is type(err)
        assert with_message.message == "broker says hi"


def test_str_includes_name_code_and_message() -> None:
    err = error_for_code(6, "not the leader for foo-0")
    assert str(err) == "NOT_LEADER_OR_FOLLOWER (code 6): not the leader for foo-0"
    for row in error_rows():
        err = error_for_code(row.code)
        assert str(err) == f"{row.name} (code {row.code}): {ERRORS_BY_CODE[row.code].description}"


def test_str_uses_description_for_missing_or_empty_message() -> None:
    expected = f"REQUEST_TIMED_OUT (code 7): {errors.RequestTimedOutError.description}"
    assert str(errors.RequestTimedOutError()) == expected
    assert str(errors.RequestTimedOutError(None)) == expected
    assert str(errors.RequestTimedOutError("")) == expected


@pytest.mark.parametrize("code", [99, 129, 32767, -2, -32768, 100_000])
def test_unknown_code(code: int) -> None:
    err = error_for_code(code, "from the future")
    assert type(err) is UnknownBrokerError
    assert isinstance(err, BrokerResponseError) and isinstance(err, KafkaError)
    assert err.code == code
    assert err.retriable is False
    assert err.message == "from the future"
    assert str(err) == f"UNKNOWN_ERROR_CODE (code {code}): from the future"
    assert f"(code {code})" in str(error_for_code(code))


@given(st.integers(min_value=-(2**15), max_value=2**15 - 1))
def test_any_int16_code_gives_an_error_with_that_code(code: int) -> None:
    if code == 0:
        return
    err = error_for_code(code)
    assert err.code == code
    assert f"(code {code})" in str(err)
    assert type(err) is ERRORS_BY_CODE.get(code, UnknownBrokerError)


def test_unknown_code_is_per_instance() -> None:
    a, b = error_for_code(500), error_for_code(501)
    assert (a.code, b.code) == (500, 501)
    assert "code" not in vars(UnknownBrokerError)


def test_code_zero_is_not_an_error() -> None:
    with pytest.raises(ValueError, match="NONE"):
        error_for_code(0)


def test_base_class_is_abstract() -> None:
    with pytest.raises(TypeError):
        BrokerResponseError("boom")


@pytest.mark.parametrize(
    "err",
    [error_for_code(6), error_for_code(45, "seq 7, expected 5"), error_for_code(1234, "new")],
    ids=["known", "known-with-message", "unknown"],
)
def test_pickle_round_trip(err: BrokerResponseError) -> None:
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is type(err)
    assert (copy.code, copy.message, str(copy)) == (err.code, err.message, str(err))


#: Errors whose __init__ takes more than the message: BaseException's pickling rebuilt them as
#: cls(*args), which raised (a ProcessPoolExecutor worker's delivery failure broke the pool).
RICHER_ERRORS = [
    errors.DeliveryTimeoutError("1 record(s) for t-0 expired", possibly_persisted=True),
    errors.UnsupportedOptionError("option 'group.id' is a consumer option", option="group.id"),
    errors.SendManyError("2 of 3 records failed", [None, ValueError("x"), None]),
    errors.AuthenticationError("bad password", mechanism="PLAIN", broker="h:9092"),
    errors.SaslMechanismNotEnabledError("no", mechanism="PLAIN", broker="h:9092", enabled=("SCRAM-SHA-512",)),
    errors.PreparedTransactionError("fenced", prepared=("tid", 1, 2)),
    errors.PartitionNotFoundError("orders", 7, 3),
]


@pytest.mark.parametrize("err", RICHER_ERRORS, ids=lambda e: type(e).__name__)
def test_errors_with_more_than_a_message_survive_pickle_and_copy(err: KafkaError) -> None:
    for back in (pickle.loads(pickle.dumps(err)), copy.copy(err)):
        assert type(back) is type(err)
        assert str(back) == str(err)
        assert repr(vars(back)) == repr(vars(err))


def _expire() -> None:
    raise errors.DeliveryTimeoutError("1 record(s) for t-0 expired", possibly_persisted=True)


def test_a_process_pool_worker_hands_a_delivery_failure_back() -> None:
    with concurrent.futures.ProcessPoolExecutor(1) as pool, pytest.raises(errors.DeliveryTimeoutError) as info:
        pool.submit(_expire).result(timeout=60)
    assert info.value.possibly_persisted is True


def test_catchable_as_kafka_error() -> None:
    with pytest.raises(KafkaError) as info:
        raise error_for_code(3, "no such topic")
    assert isinstance(info.value, errors.UnknownTopicOrPartitionError)
    assert info.value.retriable is True


def test_stale_metadata_errors_are_marked_in_the_table() -> None:
    # Java's InvalidMetadataException family: the answer means the leader view is stale.
    stale = {code for code, cls in errors.ERRORS_BY_CODE.items() if cls.invalid_metadata}
    assert {3, 5, 6, 13, 74} <= stale
    assert errors.RequestTimedOutError.code not in stale  # retriable, but the leader may be right
    assert errors.MessageTooLargeError.code not in stale
