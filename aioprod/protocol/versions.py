"""API version negotiation, sans-IO.

A connection first sends ApiVersions at the highest version it knows. A broker that
does not know that version answers (KIP-511) with an ApiVersionsResponse *v0* whose
error code is UNSUPPORTED_VERSION (35) and whose ``api_keys`` list, since Kafka 2.4,
holds the ApiVersions versions the broker supports; older brokers list nothing, and
the client then falls back to v0. :func:`read_api_versions_response` turns the raw
response frame into either the decoded response or the version to retry with;
:func:`choose_version` then picks, per API, the highest version both sides support
(within :data:`CLIENT_VERSION_CAPS` for the few APIs whose newest versions a plain client
must not use by default).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from aioprod.errors import ProtocolError, UnsupportedVersionError
from aioprod.protocol.framing import decode_response
from aioprod.protocol.messages import (
    AddPartitionsToTxnRequest,
    ApiVersionsRequest,
    ApiVersionsResponse,
    EndTxnRequest,
    ProduceRequest,
    TxnOffsetCommitRequest,
)
from aioprod.protocol.primitives import Reader
from aioprod.protocol.schema import Request, Response

__all__ = [
    "CLIENT_THROTTLES_FROM",
    "CLIENT_VERSION_CAPS",
    "TRANSACTIONS_V2_VERSIONS",
    "TRANSACTION_VERSION_FEATURE",
    "UNSUPPORTED_VERSION",
    "api_name",
    "broker_versions",
    "choose_version",
    "client_throttle_ms",
    "read_api_versions_response",
]

#: Kafka error code UNSUPPORTED_VERSION.
UNSUPPORTED_VERSION = 35


def api_name(request_cls: type[Request]) -> str:
    """``ProduceRequest`` -> ``"Produce (API key 0)"``, for error messages."""
    name = request_cls.__name__.removesuffix("Request")
    return f"{name} (API key {request_cls.API_KEY})"


#: APIs a client must not send at the highest version declared unless it opts in (see
#: ``max_version`` of :func:`choose_version`): AddPartitionsToTxn v4+ is broker-to-broker
#: only (KIP-890; the Java client sends v3 at most); Produce v12, TxnOffsetCommit v5 and
#: EndTxn v5 are transactions v2 (KIP-890 part 2), whose meaning changes inside a
#: transaction: they are used only once the cluster finalizes ``transaction.version`` >= 2.
CLIENT_VERSION_CAPS: Mapping[int, int] = MappingProxyType(
    {
        AddPartitionsToTxnRequest.API_KEY: 3,
        EndTxnRequest.API_KEY: 4,
        ProduceRequest.API_KEY: 11,
        TxnOffsetCommitRequest.API_KEY: 4,
    }
)
#: The ceilings of those APIs under transactions v2.
TRANSACTIONS_V2_VERSIONS: Mapping[int, int] = MappingProxyType(
    {EndTxnRequest.API_KEY: 5, ProduceRequest.API_KEY: 12, TxnOffsetCommitRequest.API_KEY: 5}
)
#: The feature a cluster finalizes at level 2 or more when it speaks transactions v2.
TRANSACTION_VERSION_FEATURE = "transaction.version"


#: KIP-219: from these response versions on (API key -> first version), a broker answers
#: at once and expects the client to send it nothing more for ``throttle_time_ms``; before
#: them the broker delayed its answer itself, so the client must not wait again.
CLIENT_THROTTLES_FROM: Mapping[int, int] = MappingProxyType(
    {
        0: 6,  # Produce
        2: 3,  # ListOffsets
        3: 6,  # Metadata
        9: 4,  # OffsetFetch
        10: 2,  # FindCoordinator
        18: 2,  # ApiVersions
        19: 3,  # CreateTopics
        22: 1,  # InitProducerId
        24: 1,  # AddPartitionsToTxn
        25: 1,  # AddOffsetsToTxn
        26: 1,  # EndTxn
        28: 1,  # TxnOffsetCommit
    }
)


def client_throttle_ms(response: Response, version: int) -> int:
    """How long the client must leave this broker alone after ``response`` (KIP-219)."""
    first = CLIENT_THROTTLES_FROM.get(response.API_KEY)
    if first is None or version < first:
        return 0
    return max(0, int(getattr(response, "throttle_time_ms", 0)))


def choose_version(
    request_cls: type[Request],
    broker_versions: Mapping[int, tuple[int, int]],
    *,
    max_version: int | None = None,
) -> int:
    """The highest version of ``request_cls`` both this client and the broker support.

    ``broker_versions`` maps API key to the broker's inclusive ``(min, max)`` range, as
    returned by :func:`broker_versions`. Our ceiling is the class's ``MAX_VERSION``, lowered
    to :data:`CLIENT_VERSION_CAPS` for the APIs listed there; an explicit ``max_version``
    replaces that cap (never exceeding ``MAX_VERSION``). Raises
    :class:`UnsupportedVersionError` naming the API and both ranges when they do not
    overlap or the broker lacks the API.
    """
    ceiling = CLIENT_VERSION_CAPS.get(request_cls.API_KEY, request_cls.MAX_VERSION)
    if max_version is not None:
        ceiling = max_version
    ceiling = min(ceiling, request_cls.MAX_VERSION)
    ours = f"{request_cls.MIN_VERSION}-{ceiling}"
    theirs = broker_versions.get(request_cls.API_KEY)
    if theirs is None:
        raise UnsupportedVersionError(
            f"{api_name(request_cls)}: the broker does not support this API (client supports versions {ours})"
        )
    broker_min, broker_max = theirs
    low = max(request_cls.MIN_VERSION, broker_min)
    high = min(ceiling, broker_max)
    if low > high:
        raise UnsupportedVersionError(
            f"{api_name(request_cls)}: no common version "
            f"(client supports {ours}, broker supports {broker_min}-{broker_max})"
        )
    return high


def broker_versions(response: ApiVersionsResponse) -> dict[int, tuple[int, int]]:
    """The ``api_key -> (min, max)`` map of a successful ApiVersions response."""
    return {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}


def read_api_versions_response(frame: bytes | memoryview, sent_version: int) -> ApiVersionsResponse | int:
    """Interpret the response to an ApiVersions request sent at ``sent_version``.

    ``frame`` is one response frame without its size prefix (correlation id first), as
    :class:`~aioprod.protocol.framing.FrameDecoder` yields it. Returns the decoded
    response (whose ``error_code`` the caller must still check: it is non-zero for
    errors other than a version mismatch), or, when the broker does not support
    ``sent_version``, the lower version to retry with. Raises
    :class:`UnsupportedVersionError` when no version can work and
    :class:`~aioprod.errors.ProtocolError` for malformed frames.
    """
    if not ApiVersionsRequest.MIN_VERSION <= sent_version <= ApiVersionsRequest.MAX_VERSION:
        raise ValueError(f"ApiVersions has no version {sent_version}")
    r = Reader(frame)
    r.int32()  # correlation id; ApiVersions responses always use header v0
    error_code = r.int16()  # the first body field in every version
    if error_code == UNSUPPORTED_VERSION:
        if sent_version == 0:
            raise UnsupportedVersionError("the broker does not support ApiVersions v0")
        # The broker answers in v0 (KIP-511); be lenient with one that used our version.
        try:
            response = _decode_first(frame, (0, sent_version))
        except ProtocolError:
            # Some brokers (librdkafka's mock cluster) send a body neither version can
            # read; the error code alone still says "lower", so step down by one.
            return sent_version - 1
        return _retry_version(response, sent_version)
    if error_code and sent_version:
        # Other errors come at the version we sent, but parse v0 too, as the Java client does.
        return _decode_first(frame, (sent_version, 0))
    return _decode_first(frame, (sent_version,))


def _decode_first(frame: bytes | memoryview, versions: Sequence[int]) -> ApiVersionsResponse:
    first_error: ProtocolError | None = None
    for version in versions:
        try:
            return decode_response(frame, ApiVersionsResponse, version)
        except ProtocolError as exc:
            first_error = first_error or exc
    assert first_error is not None
    raise first_error


def _retry_version(response: ApiVersionsResponse, sent_version: int) -> int:
    listed = broker_versions(response).get(ApiVersionsRequest.API_KEY)
    if listed is None:
        return 0  # brokers before 2.4 do not say which versions they support
    broker_min, broker_max = listed
    # Never retry at or above the version just refused, whatever the broker claims.
    version = min(broker_max, ApiVersionsRequest.MAX_VERSION, sent_version - 1)
    if version < max(broker_min, ApiVersionsRequest.MIN_VERSION):
        raise UnsupportedVersionError(
            f"{api_name(ApiVersionsRequest)}: no common version (client supports "
            f"{ApiVersionsRequest.MIN_VERSION}-{ApiVersionsRequest.MAX_VERSION} and was refused "
            f"v{sent_version}, broker supports {broker_min}-{broker_max})"
        )
    return version
