"""The error tree: every Kafka, configuration and delivery error aioprod raises derives
from :class:`KafkaError`.

Configuration mistakes (and records too large) also derive from ``ValueError`` so that
callers who only know the standard library still catch them; a malformed argument to a
call is a plain ``TypeError``/``ValueError``, a programming error, not a Kafka one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType, TracebackType
from typing import Any, Final


class KafkaError(Exception):
    """Base of every Kafka, configuration and delivery error aioprod raises."""

    #: Whether repeating the same operation may succeed.
    retriable: bool = False

    def __reduce__(self) -> tuple[Any, ...]:
        # BaseException's rebuilds with cls(*args), which fails for the subclasses whose
        # __init__ needs more than the message (possibly_persisted=, option=, results, ...).
        return (_rebuild_error, (type(self), self.args, self.__dict__))


def _rebuild_error(cls: type[KafkaError], args: tuple[Any, ...], state: dict[str, Any]) -> KafkaError:
    """Unpickle (or copy) an error without calling its __init__: see KafkaError.__reduce__."""
    error = cls.__new__(cls, *args)
    error.args = args  # OSError's __new__ leaves them to __init__ in some subclasses
    error.__dict__.update(state)
    return error


def copy_error(error: KafkaError, traceback: TracebackType | None = None) -> KafkaError:
    """``error`` as a new object: same class, arguments, attributes, cause and context, and
    ``traceback``. An error kept to be raised again (one batch's, for each of its records; a
    topic's refusal, for each send) is raised as a copy: raising the kept object again would
    add each raiser's frames to its one traceback, and keep them all alive."""
    copy = _rebuild_error(type(error), error.args, error.__dict__)
    notes = error.__dict__.get("__notes__")
    if type(notes) is list:
        copy.__notes__ = list(notes)  # add_note appends in place: each copy gets its own list
    copy.__cause__ = error.__cause__
    copy.__context__ = error.__context__
    copy.__suppress_context__ = error.__suppress_context__
    return copy.with_traceback(traceback)


class ConfigError(KafkaError, ValueError):
    """A producer option is unknown, malformed or conflicts with another."""


class UnsupportedOptionError(ConfigError):
    """A known Kafka client option that aioprod does not implement (a consumer's, Schema
    Registry's, or one of the Java client's): refused by name, never taken for a typo.
    ``option`` is the name as given."""

    def __init__(self, message: str, *, option: str) -> None:
        super().__init__(message)
        self.option = option


class ProtocolError(KafkaError):
    """Bytes that do not follow the Kafka wire format.

    ``remote`` says whose fault it is: True for data received from a broker, False for a
    request this client was asked to build.
    """

    def __init__(self, message: str, *, remote: bool = True) -> None:
        super().__init__(message)
        self.remote = remote


class CorruptRecordError(ProtocolError):
    """A record batch failed its CRC, length or codec checks."""


class UnsupportedVersionError(KafkaError):
    """The broker and the client share no version of an API."""


class KafkaConnectionError(KafkaError):
    """The connection to a broker failed or was closed."""

    retriable = True


class KafkaTimeoutError(KafkaError, TimeoutError):
    """An operation did not finish within its configured time."""

    retriable = True


class ProducerClosedError(KafkaError):
    """The producer is not started, or is closed or closing.

    For a record that close() failed, ``possibly_persisted`` says whether its batch may
    have reached the broker (it was on the wire, or an earlier attempt's outcome is
    unknown) or certainly did not.
    """

    def __init__(self, message: str, *, possibly_persisted: bool = False) -> None:
        super().__init__(message)
        self.possibly_persisted = possibly_persisted


class RecordTooLargeError(KafkaError, ValueError):
    """A record cannot fit in a request or in the producer's buffer."""


class PartitionNotFoundError(KafkaError, ValueError):
    """A record names a partition its topic does not have: the cluster's answers lacked it for
    ``retry_backoff_max_ms`` (one lagging broker's view proves nothing), or it is beyond the
    topic's partitions the producer knows. ``topic``, ``partition`` and ``partition_count`` (as
    of the last metadata) say which; it is a ``ValueError`` too, for what the caller passed."""

    def __init__(self, topic: str, partition: int, partition_count: int) -> None:
        super().__init__(f"partition {partition} does not exist: {_partitions_of(topic, partition_count)}")
        self.topic = topic
        self.partition = partition
        self.partition_count = partition_count


def _partitions_of(topic: str, count: int) -> str:
    """``topic 'orders' has 3 partitions (0-2)``, as the messages about a missing partition say it."""
    return f"topic {topic!r} has {count} partition" + ("" if count == 1 else "s") + f" (0-{count - 1})"


class InvalidBatchError(KafkaError):
    """The broker refused the record's batch for other records of it (INVALID_RECORD or
    INVALID_TIMESTAMP naming them, KIP-467): those records get the broker's error; this one was
    not at fault and can be sent again as it is. ``possibly_persisted`` is True when an earlier
    attempt of the batch got no answer (it may be in the log: check before sending it again),
    else False (it was not written). The broker's error is the ``__cause__``."""

    possibly_persisted = False


class DeliveryTimeoutError(KafkaTimeoutError):
    """A record was not acknowledged within ``delivery_timeout_ms``.

    ``possibly_persisted`` is False when its batch never left the client (it is certainly
    not in the log) and True when the batch was on the wire when time ran out, so the
    broker may have written it.
    """

    def __init__(self, message: str, *, possibly_persisted: bool) -> None:
        super().__init__(message)
        self.possibly_persisted = possibly_persisted


class SendManyError(KafkaError):
    """Some records of a ``send_many`` call failed.

    ``results`` holds, in input order, each record's ``RecordMetadata`` or its exception.
    """

    def __init__(self, message: str, results: list[Any]) -> None:
        super().__init__(message)
        self.results = results


class ProducerFatalError(KafkaError):
    """The producer hit an error it cannot recover from; it accepts no more records.

    The original error is the ``__cause__``. For a record it failed, ``possibly_persisted``
    says whether the record's batch may be in the log (it was sent and its outcome is
    unknown) or certainly is not. A record the broker acknowledged is reported acknowledged,
    even after the producer failed.
    """

    def __init__(self, message: str, *, possibly_persisted: bool = False) -> None:
        super().__init__(message)
        self.possibly_persisted = possibly_persisted


class TransactionError(KafkaError):
    """Base of the transactional producer's own errors."""


class TransactionStateError(TransactionError, RuntimeError):
    """A transactional call that the producer's state does not allow now: ``send()`` outside
    a transaction, ``commit_transaction()`` without one, two calls at once, and so on."""


class TransactionAbortableError(TransactionError):
    """The current transaction cannot commit (a record of it failed, the broker asked for an
    abort, the consumer group moved on): call ``abort_transaction()``, then begin again. The
    producer stays usable. The cause is the ``__cause__``."""


class TransactionAbortedError(TransactionError):
    """The record's transaction was aborted before the record was acknowledged.

    ``possibly_persisted`` is True when its batch had been sent (a retry was pending): it may
    be in the log, hidden from ``read_committed`` consumers by the abort marker."""

    def __init__(self, message: str, *, possibly_persisted: bool = False) -> None:
        super().__init__(message)
        self.possibly_persisted = possibly_persisted


class PreparedTransactionError(TransactionError):
    """A prepared transaction (see ``Producer.prepare_transaction``) cannot be ended as asked:
    it is no longer open under its producer id and epoch. A newer producer with its
    transactional id fenced it, the coordinator aborted it when it outlived its transaction
    timeout, or it had already ended the other way. ``prepared`` is its handle; the broker's
    answer is the ``__cause__``. Also raised, with no request sent, for a handle prepared in
    another cluster than the one the producer's brokers are (its ``cluster_id``): there its
    producer id and epoch may be another producer's."""

    def __init__(self, message: str, prepared: Any) -> None:
        super().__init__(message)
        self.prepared = prepared


class AuthenticationError(KafkaError):
    """A broker refused this client's credentials, or the client refused the broker's.

    Not retriable: the same credentials fail the same way again. ``mechanism`` is the SASL
    mechanism (or ``"TLS"``) and ``broker`` the ``host:port`` it happened with.
    """

    def __init__(self, message: str, *, mechanism: str, broker: str) -> None:
        super().__init__(message)
        self.mechanism = mechanism
        self.broker = broker


class SaslMechanismNotEnabledError(AuthenticationError):
    """The broker does not enable the configured SASL mechanism; ``enabled`` lists those it does."""

    def __init__(self, message: str, *, mechanism: str, broker: str, enabled: tuple[str, ...]) -> None:
        super().__init__(message, mechanism=mechanism, broker=broker)
        self.enabled = enabled


class SslAuthenticationError(AuthenticationError):
    """The TLS handshake failed: a certificate did not verify, or the peer refused ours."""

    def __init__(self, message: str, *, broker: str) -> None:
        super().__init__(message, mechanism="TLS", broker=broker)


# ---------------------------------------------------------------------------------------------
# Broker error codes
#
# Every non-zero ``error_code`` a broker can put in a response maps to one subclass of
# BrokerResponseError. ``_BROKER_ERROR_TABLE`` below is the single source of truth; the class
# declarations between the GENERATED markers are written from it by
# ``tools/gen_error_classes.py`` (run it after editing the table; ``--check`` verifies).
#
# Class naming rule: split the protocol name on ``_``, drop a final ``ERROR`` or ``EXCEPTION``
# word, capitalise each word (``ID`` -> ``Id``, ``TXN`` -> ``Txn``) and append ``Error``; if
# that name is already taken by a client-side class of this module, prefix ``Broker``.
# Examples: NOT_LEADER_OR_FOLLOWER -> NotLeaderOrFollowerError, UNKNOWN_SERVER_ERROR ->
# UnknownServerError, NETWORK_EXCEPTION -> NetworkError, UNSUPPORTED_VERSION ->
# BrokerUnsupportedVersionError (UnsupportedVersionError is the client-side error).
#
# Broker errors are deliberately *not* mixed into the client-side tree: REQUEST_TIMED_OUT is
# RequestTimedOutError, not a KafkaTimeoutError/TimeoutError, and MESSAGE_TOO_LARGE is not a
# RecordTooLargeError. Their direct base is always BrokerResponseError.
# ---------------------------------------------------------------------------------------------

#: (code, protocol name, retriable, invalid metadata, short description) for every protocol
#: error code except 0 (NONE), sorted by code. ``retriable`` follows the Java client: True
#: when its exception for the code is a RetriableException. ``invalid metadata`` is True
#: when the Java client's exception is an InvalidMetadataException: the answer means the
#: client's view of leaders is stale, so a metadata refresh is due before the retry.
_BROKER_ERROR_TABLE: Final[tuple[tuple[int, str, bool, bool, str], ...]] = (
    (-1, "UNKNOWN_SERVER_ERROR", False, False, "Unexpected failure on the broker while handling the request."),
    (1, "OFFSET_OUT_OF_RANGE", False, False, "Requested offset lies outside the partition's retained log."),
    (2, "CORRUPT_MESSAGE", True, False, "The broker found a record batch corrupt or invalid."),
    (3, "UNKNOWN_TOPIC_OR_PARTITION", True, True, "The broker does not host this topic or partition."),
    (4, "INVALID_FETCH_SIZE", False, False, "The fetch size in the request is not valid."),
    (5, "LEADER_NOT_AVAILABLE", True, True, "The partition has no leader right now (e.g. during an election)."),
    (6, "NOT_LEADER_OR_FOLLOWER", True, True, "This broker is not the leader (or a replica) of the partition."),
    (7, "REQUEST_TIMED_OUT", True, False, "The broker did not complete the request within its timeout."),
    (8, "BROKER_NOT_AVAILABLE", False, False, "The addressed broker is not available."),
    (9, "REPLICA_NOT_AVAILABLE", True, True, "A replica the request needs is not available."),
    (10, "MESSAGE_TOO_LARGE", False, False, "The request holds a batch larger than the broker accepts."),
    (11, "STALE_CONTROLLER_EPOCH", False, False, "The request came from a controller with an outdated epoch."),
    (12, "OFFSET_METADATA_TOO_LARGE", False, False, "The offset commit metadata string is too long."),
    (13, "NETWORK_EXCEPTION", True, True, "A network failure interrupted the request."),
    (14, "COORDINATOR_LOAD_IN_PROGRESS", True, False, "The coordinator is still loading its state."),
    (15, "COORDINATOR_NOT_AVAILABLE", True, False, "The group or transaction coordinator is not available."),
    (16, "NOT_COORDINATOR", True, False, "This broker is not the coordinator for the group or transaction."),
    (17, "INVALID_TOPIC_EXCEPTION", False, False, "The topic name is not valid for this operation."),
    (18, "RECORD_LIST_TOO_LARGE", False, False, "A record batch is larger than a log segment allows."),
    (19, "NOT_ENOUGH_REPLICAS", True, False, "Too few in-sync replicas to accept the write."),
    (20, "NOT_ENOUGH_REPLICAS_AFTER_APPEND", True, False, "Appended, but in-sync replicas fell below the minimum."),
    (21, "INVALID_REQUIRED_ACKS", False, False, "The acks value in the produce request is not valid."),
    (22, "ILLEGAL_GENERATION", False, False, "The group generation id is not the current one."),
    (23, "INCONSISTENT_GROUP_PROTOCOL", False, False, "The member's protocols do not match the group's."),
    (24, "INVALID_GROUP_ID", False, False, "The group id is empty or otherwise invalid."),
    (25, "UNKNOWN_MEMBER_ID", False, False, "The coordinator does not know this group member id."),
    (26, "INVALID_SESSION_TIMEOUT", False, False, "The session timeout is outside the broker's allowed range."),
    (27, "REBALANCE_IN_PROGRESS", False, False, "The consumer group is rebalancing."),
    (28, "INVALID_COMMIT_OFFSET_SIZE", False, False, "The size of the committed offset data is not valid."),
    (29, "TOPIC_AUTHORIZATION_FAILED", False, False, "Not authorized to access the topic."),
    (30, "GROUP_AUTHORIZATION_FAILED", False, False, "Not authorized to access the group."),
    (31, "CLUSTER_AUTHORIZATION_FAILED", False, False, "Not authorized for this cluster-level operation."),
    (32, "INVALID_TIMESTAMP", False, False, "A record timestamp is outside the accepted range."),
    (33, "UNSUPPORTED_SASL_MECHANISM", False, False, "The SASL mechanism asked for is not enabled on the broker."),
    (34, "ILLEGAL_SASL_STATE", False, False, "The request is out of order for the SASL handshake."),
    (35, "UNSUPPORTED_VERSION", False, False, "The broker does not support this API version."),
    (36, "TOPIC_ALREADY_EXISTS", False, False, "The topic to be created exists already."),
    (37, "INVALID_PARTITIONS", False, False, "The partition count is not valid."),
    (38, "INVALID_REPLICATION_FACTOR", False, False, "The replication factor is not valid."),
    (39, "INVALID_REPLICA_ASSIGNMENT", False, False, "The requested placement of replicas is not valid."),
    (40, "INVALID_CONFIG", False, False, "A configuration value is not valid."),
    (41, "NOT_CONTROLLER", True, False, "This broker is not the active controller."),
    (42, "INVALID_REQUEST", False, False, "The request is malformed or not valid for this broker."),
    (43, "UNSUPPORTED_FOR_MESSAGE_FORMAT", False, False, "The topic's message format cannot carry this request."),
    (44, "POLICY_VIOLATION", False, False, "A broker-side policy rejected the request."),
    (45, "OUT_OF_ORDER_SEQUENCE_NUMBER", False, False, "The producer sequence number is not the expected one."),
    (46, "DUPLICATE_SEQUENCE_NUMBER", False, False, "The broker already has a batch with this sequence number."),
    (47, "INVALID_PRODUCER_EPOCH", False, False, "The producer epoch is older than the one the broker knows."),
    (48, "INVALID_TXN_STATE", False, False, "The operation is not allowed in the transaction's current state."),
    (49, "INVALID_PRODUCER_ID_MAPPING", False, False, "The producer id is not assigned to this transactional id."),
    (50, "INVALID_TRANSACTION_TIMEOUT", False, False, "The transaction timeout exceeds the broker's maximum."),
    (51, "CONCURRENT_TRANSACTIONS", True, False, "Another transaction operation is still running."),
    (52, "TRANSACTION_COORDINATOR_FENCED", False, False, "A newer transaction coordinator has taken over."),
    (53, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", False, False, "Not authorized to use this transactional id."),
    (54, "SECURITY_DISABLED", False, False, "Security features are disabled on the broker."),
    (55, "OPERATION_NOT_ATTEMPTED", False, False, "Skipped because a related operation in the request failed."),
    (56, "KAFKA_STORAGE_ERROR", True, True, "A disk or log directory error on the broker."),
    (57, "LOG_DIR_NOT_FOUND", False, False, "The named log directory does not exist on the broker."),
    (58, "SASL_AUTHENTICATION_FAILED", False, False, "The broker rejected the SASL credentials."),
    (59, "UNKNOWN_PRODUCER_ID", False, False, "The broker has no state for this producer id."),
    (60, "REASSIGNMENT_IN_PROGRESS", False, False, "The partition is being reassigned at the moment."),
    (61, "DELEGATION_TOKEN_AUTH_DISABLED", False, False, "Delegation token authentication is disabled."),
    (62, "DELEGATION_TOKEN_NOT_FOUND", False, False, "The delegation token does not exist."),
    (63, "DELEGATION_TOKEN_OWNER_MISMATCH", False, False, "The principal is not an owner or renewer of the token."),
    (64, "DELEGATION_TOKEN_REQUEST_NOT_ALLOWED", False, False, "Token requests are not allowed on this connection."),
    (65, "DELEGATION_TOKEN_AUTHORIZATION_FAILED", False, False, "Not authorized for this delegation token action."),
    (66, "DELEGATION_TOKEN_EXPIRED", False, False, "The delegation token is past its expiry time."),
    (67, "INVALID_PRINCIPAL_TYPE", False, False, "The principal type is not supported."),
    (68, "NON_EMPTY_GROUP", False, False, "The group still has members."),
    (69, "GROUP_ID_NOT_FOUND", False, False, "No group with this id is known to the coordinator."),
    (70, "FETCH_SESSION_ID_NOT_FOUND", True, False, "The fetch session id is unknown to the broker."),
    (71, "INVALID_FETCH_SESSION_EPOCH", True, False, "The fetch session epoch is not the expected one."),
    (72, "LISTENER_NOT_FOUND", True, True, "The leader has no listener matching the one this request used."),
    (73, "TOPIC_DELETION_DISABLED", False, False, "Topic deletion is disabled on the broker."),
    (74, "FENCED_LEADER_EPOCH", True, True, "The request's leader epoch is older than the broker's."),
    (75, "UNKNOWN_LEADER_EPOCH", True, True, "The request's leader epoch is newer than the broker's."),
    (76, "UNSUPPORTED_COMPRESSION_TYPE", False, False, "The request version cannot read the partition's codec."),
    (77, "STALE_BROKER_EPOCH", False, False, "The broker epoch in the request is outdated."),
    (78, "OFFSET_NOT_AVAILABLE", True, False, "The offset is not available yet, e.g. right after a leader change."),
    (79, "MEMBER_ID_REQUIRED", False, False, "The member must rejoin with the member id the coordinator assigned."),
    (80, "PREFERRED_LEADER_NOT_AVAILABLE", True, False, "The preferred replica cannot become leader at the moment."),
    (81, "GROUP_MAX_SIZE_REACHED", False, False, "The group has reached its maximum size."),
    (82, "FENCED_INSTANCE_ID", False, False, "Another member with the same group instance id fenced this one."),
    (83, "ELIGIBLE_LEADERS_NOT_AVAILABLE", True, False, "No eligible replica can be elected leader."),
    (84, "ELECTION_NOT_NEEDED", True, False, "The leader election is not needed."),
    (85, "NO_REASSIGNMENT_IN_PROGRESS", False, False, "There is no ongoing partition reassignment to act on."),
    (86, "GROUP_SUBSCRIBED_TO_TOPIC", False, False, "The group is still subscribed to the topic."),
    (87, "INVALID_RECORD", False, False, "The broker rejected a record as invalid."),
    (88, "UNSTABLE_OFFSET_COMMIT", True, False, "Pending transactional offset commits make the offset unstable."),
    (89, "THROTTLING_QUOTA_EXCEEDED", True, False, "The request exceeded a throttling quota."),
    (90, "PRODUCER_FENCED", False, False, "A newer producer with the same transactional id fenced this one."),
    (91, "RESOURCE_NOT_FOUND", False, False, "The requested resource does not exist."),
    (92, "DUPLICATE_RESOURCE", False, False, "The request names the same resource more than once."),
    (93, "UNACCEPTABLE_CREDENTIAL", False, False, "The credential does not meet the broker's requirements."),
    (94, "INCONSISTENT_VOTER_SET", False, False, "The voter is not part of the expected quorum voter set."),
    (95, "INVALID_UPDATE_VERSION", False, False, "The update version is not valid."),
    (96, "FEATURE_UPDATE_FAILED", False, False, "Applying a feature update failed."),
    (97, "PRINCIPAL_DESERIALIZATION_FAILURE", False, False, "A forwarded request's principal could not be decoded."),
    (98, "SNAPSHOT_NOT_FOUND", False, False, "The requested snapshot does not exist."),
    (100, "UNKNOWN_TOPIC_ID", True, True, "The broker does not know this topic id."),
    (101, "DUPLICATE_BROKER_REGISTRATION", False, False, "Another broker already registered with this id."),
    (102, "BROKER_ID_NOT_REGISTERED", False, False, "This broker id is not registered."),
    (103, "INCONSISTENT_TOPIC_ID", True, True, "The topic id does not match the one in the broker's log."),
    (104, "INCONSISTENT_CLUSTER_ID", False, False, "The cluster id does not match the quorum's."),
    (105, "TRANSACTIONAL_ID_NOT_FOUND", False, False, "The transactional id does not exist."),
    (106, "FETCH_SESSION_TOPIC_ID_ERROR", True, False, "The fetch session's topic ids are inconsistent."),
    (107, "INELIGIBLE_REPLICA", False, False, "A proposed in-sync replica is not eligible."),
    (108, "NEW_LEADER_ELECTED", False, False, "The partition state changed, but leadership moved meanwhile."),
    (109, "OFFSET_MOVED_TO_TIERED_STORAGE", False, False, "The offset is only in tiered (remote) storage."),
    (110, "FENCED_MEMBER_EPOCH", False, False, "The coordinator fenced the member epoch."),
    (111, "UNRELEASED_INSTANCE_ID", False, False, "The group instance id is still held by another member."),
    (112, "UNSUPPORTED_ASSIGNOR", False, False, "The group does not support the requested assignor."),
    (113, "STALE_MEMBER_EPOCH", False, False, "The member epoch is outdated."),
    (114, "MISMATCHED_ENDPOINT_TYPE", False, False, "The request was sent to the wrong endpoint type."),
    (115, "UNSUPPORTED_ENDPOINT_TYPE", False, False, "The endpoint does not support this request."),
    (116, "UNKNOWN_CONTROLLER_ID", False, False, "No controller with this id is known."),
    (117, "UNKNOWN_SUBSCRIPTION_ID", False, False, "The client telemetry subscription id is unknown."),
    (118, "TELEMETRY_TOO_LARGE", False, False, "The client telemetry payload is too large."),
    (119, "INVALID_REGISTRATION", False, False, "The controller rejected the broker registration."),
    (120, "TRANSACTION_ABORTABLE", False, False, "The transaction must be aborted; the producer may then go on."),
    (121, "INVALID_RECORD_STATE", False, False, "The share-group record's state forbids this operation."),
    (122, "SHARE_SESSION_NOT_FOUND", True, False, "The share session is unknown to the broker."),
    (123, "INVALID_SHARE_SESSION_EPOCH", True, False, "The share session epoch is not the expected one."),
    (124, "FENCED_STATE_EPOCH", False, False, "The share-group state epoch is outdated."),
    (125, "INVALID_VOTER_KEY", False, False, "The voter's directory id differs from the receiving replica's."),
    (126, "DUPLICATE_VOTER", False, False, "The voter to add is already in the quorum."),
    (127, "VOTER_NOT_FOUND", False, False, "The voter to remove is not in the quorum."),
    (128, "INVALID_REGULAR_EXPRESSION", False, False, "A topic regular expression in the request cannot be parsed."),
)


class BrokerResponseError(KafkaError):
    """An error code returned by a broker in a response.

    Subclasses (one per protocol error code, see :data:`ERRORS_BY_CODE`) set the class
    attributes ``code``, ``name`` (the protocol name, e.g. ``"NOT_LEADER_OR_FOLLOWER"``),
    ``retriable``, ``invalid_metadata`` and ``description``. Instances carry the optional
    message the broker sent along with the code. Build them with :func:`error_for_code`.
    """

    #: The protocol error code.
    code: int
    #: The protocol name of the error code, e.g. ``"NOT_LEADER_OR_FOLLOWER"``.
    name: str
    retriable: bool
    #: The answer means the client's metadata is stale (the leader moved, the topic
    #: changed): refresh it before retrying. Java's InvalidMetadataException family.
    invalid_metadata: bool = False
    #: A short description, shown by ``str()`` when the broker sent no message.
    description: str

    def __init__(self, message: str | None = None) -> None:
        if type(self) is BrokerResponseError:
            raise TypeError("BrokerResponseError is abstract; use error_for_code() or a subclass")
        super().__init__(message)
        #: The message the broker sent with the error code, if any.
        self.message = message

    def __str__(self) -> str:
        return f"{self.name} (code {self.code}): {self.message or self.description}"


class UnknownBrokerError(BrokerResponseError):
    """An error code this client does not know, e.g. from a newer broker.

    Unlike the other subclasses, ``code`` is set per instance to the code received.
    """

    name = "UNKNOWN_ERROR_CODE"
    retriable = False
    description = "The broker returned an error code this client does not know."

    def __init__(self, code: int, message: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.args = (code, message)


# BEGIN GENERATED by tools/gen_error_classes.py from _BROKER_ERROR_TABLE. Do not edit by hand.


class UnknownServerError(BrokerResponseError):
    """Unexpected failure on the broker while handling the request."""

    code = -1
    name = "UNKNOWN_SERVER_ERROR"
    retriable = False
    description = "Unexpected failure on the broker while handling the request."


class OffsetOutOfRangeError(BrokerResponseError):
    """Requested offset lies outside the partition's retained log."""

    code = 1
    name = "OFFSET_OUT_OF_RANGE"
    retriable = False
    description = "Requested offset lies outside the partition's retained log."


class CorruptMessageError(BrokerResponseError):
    """The broker found a record batch corrupt or invalid."""

    code = 2
    name = "CORRUPT_MESSAGE"
    retriable = True
    description = "The broker found a record batch corrupt or invalid."


class UnknownTopicOrPartitionError(BrokerResponseError):
    """The broker does not host this topic or partition."""

    code = 3
    name = "UNKNOWN_TOPIC_OR_PARTITION"
    retriable = True
    invalid_metadata = True
    description = "The broker does not host this topic or partition."


class InvalidFetchSizeError(BrokerResponseError):
    """The fetch size in the request is not valid."""

    code = 4
    name = "INVALID_FETCH_SIZE"
    retriable = False
    description = "The fetch size in the request is not valid."


class LeaderNotAvailableError(BrokerResponseError):
    """The partition has no leader right now (e.g. during an election)."""

    code = 5
    name = "LEADER_NOT_AVAILABLE"
    retriable = True
    invalid_metadata = True
    description = "The partition has no leader right now (e.g. during an election)."


class NotLeaderOrFollowerError(BrokerResponseError):
    """This broker is not the leader (or a replica) of the partition."""

    code = 6
    name = "NOT_LEADER_OR_FOLLOWER"
    retriable = True
    invalid_metadata = True
    description = "This broker is not the leader (or a replica) of the partition."


class RequestTimedOutError(BrokerResponseError):
    """The broker did not complete the request within its timeout."""

    code = 7
    name = "REQUEST_TIMED_OUT"
    retriable = True
    description = "The broker did not complete the request within its timeout."


class BrokerNotAvailableError(BrokerResponseError):
    """The addressed broker is not available."""

    code = 8
    name = "BROKER_NOT_AVAILABLE"
    retriable = False
    description = "The addressed broker is not available."


class ReplicaNotAvailableError(BrokerResponseError):
    """A replica the request needs is not available."""

    code = 9
    name = "REPLICA_NOT_AVAILABLE"
    retriable = True
    invalid_metadata = True
    description = "A replica the request needs is not available."


class MessageTooLargeError(BrokerResponseError):
    """The request holds a batch larger than the broker accepts."""

    code = 10
    name = "MESSAGE_TOO_LARGE"
    retriable = False
    description = "The request holds a batch larger than the broker accepts."


class StaleControllerEpochError(BrokerResponseError):
    """The request came from a controller with an outdated epoch."""

    code = 11
    name = "STALE_CONTROLLER_EPOCH"
    retriable = False
    description = "The request came from a controller with an outdated epoch."


class OffsetMetadataTooLargeError(BrokerResponseError):
    """The offset commit metadata string is too long."""

    code = 12
    name = "OFFSET_METADATA_TOO_LARGE"
    retriable = False
    description = "The offset commit metadata string is too long."


class NetworkError(BrokerResponseError):
    """A network failure interrupted the request."""

    code = 13
    name = "NETWORK_EXCEPTION"
    retriable = True
    invalid_metadata = True
    description = "A network failure interrupted the request."


class CoordinatorLoadInProgressError(BrokerResponseError):
    """The coordinator is still loading its state."""

    code = 14
    name = "COORDINATOR_LOAD_IN_PROGRESS"
    retriable = True
    description = "The coordinator is still loading its state."


class CoordinatorNotAvailableError(BrokerResponseError):
    """The group or transaction coordinator is not available."""

    code = 15
    name = "COORDINATOR_NOT_AVAILABLE"
    retriable = True
    description = "The group or transaction coordinator is not available."


class NotCoordinatorError(BrokerResponseError):
    """This broker is not the coordinator for the group or transaction."""

    code = 16
    name = "NOT_COORDINATOR"
    retriable = True
    description = "This broker is not the coordinator for the group or transaction."


class InvalidTopicError(BrokerResponseError):
    """The topic name is not valid for this operation."""

    code = 17
    name = "INVALID_TOPIC_EXCEPTION"
    retriable = False
    description = "The topic name is not valid for this operation."


class RecordListTooLargeError(BrokerResponseError):
    """A record batch is larger than a log segment allows."""

    code = 18
    name = "RECORD_LIST_TOO_LARGE"
    retriable = False
    description = "A record batch is larger than a log segment allows."


class NotEnoughReplicasError(BrokerResponseError):
    """Too few in-sync replicas to accept the write."""

    code = 19
    name = "NOT_ENOUGH_REPLICAS"
    retriable = True
    description = "Too few in-sync replicas to accept the write."


class NotEnoughReplicasAfterAppendError(BrokerResponseError):
    """Appended, but in-sync replicas fell below the minimum."""

    code = 20
    name = "NOT_ENOUGH_REPLICAS_AFTER_APPEND"
    retriable = True
    description = "Appended, but in-sync replicas fell below the minimum."


class InvalidRequiredAcksError(BrokerResponseError):
    """The acks value in the produce request is not valid."""

    code = 21
    name = "INVALID_REQUIRED_ACKS"
    retriable = False
    description = "The acks value in the produce request is not valid."


class IllegalGenerationError(BrokerResponseError):
    """The group generation id is not the current one."""

    code = 22
    name = "ILLEGAL_GENERATION"
    retriable = False
    description = "The group generation id is not the current one."


class InconsistentGroupProtocolError(BrokerResponseError):
    """The member's protocols do not match the group's."""

    code = 23
    name = "INCONSISTENT_GROUP_PROTOCOL"
    retriable = False
    description = "The member's protocols do not match the group's."


class InvalidGroupIdError(BrokerResponseError):
    """The group id is empty or otherwise invalid."""

    code = 24
    name = "INVALID_GROUP_ID"
    retriable = False
    description = "The group id is empty or otherwise invalid."


class UnknownMemberIdError(BrokerResponseError):
    """The coordinator does not know this group member id."""

    code = 25
    name = "UNKNOWN_MEMBER_ID"
    retriable = False
    description = "The coordinator does not know this group member id."


class InvalidSessionTimeoutError(BrokerResponseError):
    """The session timeout is outside the broker's allowed range."""

    code = 26
    name = "INVALID_SESSION_TIMEOUT"
    retriable = False
    description = "The session timeout is outside the broker's allowed range."


class RebalanceInProgressError(BrokerResponseError):
    """The consumer group is rebalancing."""

    code = 27
    name = "REBALANCE_IN_PROGRESS"
    retriable = False
    description = "The consumer group is rebalancing."


class InvalidCommitOffsetSizeError(BrokerResponseError):
    """The size of the committed offset data is not valid."""

    code = 28
    name = "INVALID_COMMIT_OFFSET_SIZE"
    retriable = False
    description = "The size of the committed offset data is not valid."


class TopicAuthorizationFailedError(BrokerResponseError):
    """Not authorized to access the topic."""

    code = 29
    name = "TOPIC_AUTHORIZATION_FAILED"
    retriable = False
    description = "Not authorized to access the topic."


class GroupAuthorizationFailedError(BrokerResponseError):
    """Not authorized to access the group."""

    code = 30
    name = "GROUP_AUTHORIZATION_FAILED"
    retriable = False
    description = "Not authorized to access the group."


class ClusterAuthorizationFailedError(BrokerResponseError):
    """Not authorized for this cluster-level operation."""

    code = 31
    name = "CLUSTER_AUTHORIZATION_FAILED"
    retriable = False
    description = "Not authorized for this cluster-level operation."


class InvalidTimestampError(BrokerResponseError):
    """A record timestamp is outside the accepted range."""

    code = 32
    name = "INVALID_TIMESTAMP"
    retriable = False
    description = "A record timestamp is outside the accepted range."


class UnsupportedSaslMechanismError(BrokerResponseError):
    """The SASL mechanism asked for is not enabled on the broker."""

    code = 33
    name = "UNSUPPORTED_SASL_MECHANISM"
    retriable = False
    description = "The SASL mechanism asked for is not enabled on the broker."


class IllegalSaslStateError(BrokerResponseError):
    """The request is out of order for the SASL handshake."""

    code = 34
    name = "ILLEGAL_SASL_STATE"
    retriable = False
    description = "The request is out of order for the SASL handshake."


class BrokerUnsupportedVersionError(BrokerResponseError):
    """The broker does not support this API version."""

    code = 35
    name = "UNSUPPORTED_VERSION"
    retriable = False
    description = "The broker does not support this API version."


class TopicAlreadyExistsError(BrokerResponseError):
    """The topic to be created exists already."""

    code = 36
    name = "TOPIC_ALREADY_EXISTS"
    retriable = False
    description = "The topic to be created exists already."


class InvalidPartitionsError(BrokerResponseError):
    """The partition count is not valid."""

    code = 37
    name = "INVALID_PARTITIONS"
    retriable = False
    description = "The partition count is not valid."


class InvalidReplicationFactorError(BrokerResponseError):
    """The replication factor is not valid."""

    code = 38
    name = "INVALID_REPLICATION_FACTOR"
    retriable = False
    description = "The replication factor is not valid."


class InvalidReplicaAssignmentError(BrokerResponseError):
    """The requested placement of replicas is not valid."""

    code = 39
    name = "INVALID_REPLICA_ASSIGNMENT"
    retriable = False
    description = "The requested placement of replicas is not valid."


class InvalidConfigError(BrokerResponseError):
    """A configuration value is not valid."""

    code = 40
    name = "INVALID_CONFIG"
    retriable = False
    description = "A configuration value is not valid."


class NotControllerError(BrokerResponseError):
    """This broker is not the active controller."""

    code = 41
    name = "NOT_CONTROLLER"
    retriable = True
    description = "This broker is not the active controller."


class InvalidRequestError(BrokerResponseError):
    """The request is malformed or not valid for this broker."""

    code = 42
    name = "INVALID_REQUEST"
    retriable = False
    description = "The request is malformed or not valid for this broker."


class UnsupportedForMessageFormatError(BrokerResponseError):
    """The topic's message format cannot carry this request."""

    code = 43
    name = "UNSUPPORTED_FOR_MESSAGE_FORMAT"
    retriable = False
    description = "The topic's message format cannot carry this request."


class PolicyViolationError(BrokerResponseError):
    """A broker-side policy rejected the request."""

    code = 44
    name = "POLICY_VIOLATION"
    retriable = False
    description = "A broker-side policy rejected the request."


class OutOfOrderSequenceNumberError(BrokerResponseError):
    """The producer sequence number is not the expected one."""

    code = 45
    name = "OUT_OF_ORDER_SEQUENCE_NUMBER"
    retriable = False
    description = "The producer sequence number is not the expected one."


class DuplicateSequenceNumberError(BrokerResponseError):
    """The broker already has a batch with this sequence number."""

    code = 46
    name = "DUPLICATE_SEQUENCE_NUMBER"
    retriable = False
    description = "The broker already has a batch with this sequence number."


class InvalidProducerEpochError(BrokerResponseError):
    """The producer epoch is older than the one the broker knows."""

    code = 47
    name = "INVALID_PRODUCER_EPOCH"
    retriable = False
    description = "The producer epoch is older than the one the broker knows."


class InvalidTxnStateError(BrokerResponseError):
    """The operation is not allowed in the transaction's current state."""

    code = 48
    name = "INVALID_TXN_STATE"
    retriable = False
    description = "The operation is not allowed in the transaction's current state."


class InvalidProducerIdMappingError(BrokerResponseError):
    """The producer id is not assigned to this transactional id."""

    code = 49
    name = "INVALID_PRODUCER_ID_MAPPING"
    retriable = False
    description = "The producer id is not assigned to this transactional id."


class InvalidTransactionTimeoutError(BrokerResponseError):
    """The transaction timeout exceeds the broker's maximum."""

    code = 50
    name = "INVALID_TRANSACTION_TIMEOUT"
    retriable = False
    description = "The transaction timeout exceeds the broker's maximum."


class ConcurrentTransactionsError(BrokerResponseError):
    """Another transaction operation is still running."""

    code = 51
    name = "CONCURRENT_TRANSACTIONS"
    retriable = True
    description = "Another transaction operation is still running."


class TransactionCoordinatorFencedError(BrokerResponseError):
    """A newer transaction coordinator has taken over."""

    code = 52
    name = "TRANSACTION_COORDINATOR_FENCED"
    retriable = False
    description = "A newer transaction coordinator has taken over."


class TransactionalIdAuthorizationFailedError(BrokerResponseError):
    """Not authorized to use this transactional id."""

    code = 53
    name = "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
    retriable = False
    description = "Not authorized to use this transactional id."


class SecurityDisabledError(BrokerResponseError):
    """Security features are disabled on the broker."""

    code = 54
    name = "SECURITY_DISABLED"
    retriable = False
    description = "Security features are disabled on the broker."


class OperationNotAttemptedError(BrokerResponseError):
    """Skipped because a related operation in the request failed."""

    code = 55
    name = "OPERATION_NOT_ATTEMPTED"
    retriable = False
    description = "Skipped because a related operation in the request failed."


class KafkaStorageError(BrokerResponseError):
    """A disk or log directory error on the broker."""

    code = 56
    name = "KAFKA_STORAGE_ERROR"
    retriable = True
    invalid_metadata = True
    description = "A disk or log directory error on the broker."


class LogDirNotFoundError(BrokerResponseError):
    """The named log directory does not exist on the broker."""

    code = 57
    name = "LOG_DIR_NOT_FOUND"
    retriable = False
    description = "The named log directory does not exist on the broker."


class SaslAuthenticationFailedError(BrokerResponseError):
    """The broker rejected the SASL credentials."""

    code = 58
    name = "SASL_AUTHENTICATION_FAILED"
    retriable = False
    description = "The broker rejected the SASL credentials."


class UnknownProducerIdError(BrokerResponseError):
    """The broker has no state for this producer id."""

    code = 59
    name = "UNKNOWN_PRODUCER_ID"
    retriable = False
    description = "The broker has no state for this producer id."


class ReassignmentInProgressError(BrokerResponseError):
    """The partition is being reassigned at the moment."""

    code = 60
    name = "REASSIGNMENT_IN_PROGRESS"
    retriable = False
    description = "The partition is being reassigned at the moment."


class DelegationTokenAuthDisabledError(BrokerResponseError):
    """Delegation token authentication is disabled."""

    code = 61
    name = "DELEGATION_TOKEN_AUTH_DISABLED"
    retriable = False
    description = "Delegation token authentication is disabled."


class DelegationTokenNotFoundError(BrokerResponseError):
    """The delegation token does not exist."""

    code = 62
    name = "DELEGATION_TOKEN_NOT_FOUND"
    retriable = False
    description = "The delegation token does not exist."


class DelegationTokenOwnerMismatchError(BrokerResponseError):
    """The principal is not an owner or renewer of the token."""

    code = 63
    name = "DELEGATION_TOKEN_OWNER_MISMATCH"
    retriable = False
    description = "The principal is not an owner or renewer of the token."


class DelegationTokenRequestNotAllowedError(BrokerResponseError):
    """Token requests are not allowed on this connection."""

    code = 64
    name = "DELEGATION_TOKEN_REQUEST_NOT_ALLOWED"
    retriable = False
    description = "Token requests are not allowed on this connection."


class DelegationTokenAuthorizationFailedError(BrokerResponseError):
    """Not authorized for this delegation token action."""

    code = 65
    name = "DELEGATION_TOKEN_AUTHORIZATION_FAILED"
    retriable = False
    description = "Not authorized for this delegation token action."


class DelegationTokenExpiredError(BrokerResponseError):
    """The delegation token is past its expiry time."""

    code = 66
    name = "DELEGATION_TOKEN_EXPIRED"
    retriable = False
    description = "The delegation token is past its expiry time."


class InvalidPrincipalTypeError(BrokerResponseError):
    """The principal type is not supported."""

    code = 67
    name = "INVALID_PRINCIPAL_TYPE"
    retriable = False
    description = "The principal type is not supported."


class NonEmptyGroupError(BrokerResponseError):
    """The group still has members."""

    code = 68
    name = "NON_EMPTY_GROUP"
    retriable = False
    description = "The group still has members."


class GroupIdNotFoundError(BrokerResponseError):
    """No group with this id is known to the coordinator."""

    code = 69
    name = "GROUP_ID_NOT_FOUND"
    retriable = False
    description = "No group with this id is known to the coordinator."


class FetchSessionIdNotFoundError(BrokerResponseError):
    """The fetch session id is unknown to the broker."""

    code = 70
    name = "FETCH_SESSION_ID_NOT_FOUND"
    retriable = True
    description = "The fetch session id is unknown to the broker."


class InvalidFetchSessionEpochError(BrokerResponseError):
    """The fetch session epoch is not the expected one."""

    code = 71
    name = "INVALID_FETCH_SESSION_EPOCH"
    retriable = True
    description = "The fetch session epoch is not the expected one."


class ListenerNotFoundError(BrokerResponseError):
    """The leader has no listener matching the one this request used."""

    code = 72
    name = "LISTENER_NOT_FOUND"
    retriable = True
    invalid_metadata = True
    description = "The leader has no listener matching the one this request used."


class TopicDeletionDisabledError(BrokerResponseError):
    """Topic deletion is disabled on the broker."""

    code = 73
    name = "TOPIC_DELETION_DISABLED"
    retriable = False
    description = "Topic deletion is disabled on the broker."


class FencedLeaderEpochError(BrokerResponseError):
    """The request's leader epoch is older than the broker's."""

    code = 74
    name = "FENCED_LEADER_EPOCH"
    retriable = True
    invalid_metadata = True
    description = "The request's leader epoch is older than the broker's."


class UnknownLeaderEpochError(BrokerResponseError):
    """The request's leader epoch is newer than the broker's."""

    code = 75
    name = "UNKNOWN_LEADER_EPOCH"
    retriable = True
    invalid_metadata = True
    description = "The request's leader epoch is newer than the broker's."


class UnsupportedCompressionTypeError(BrokerResponseError):
    """The request version cannot read the partition's codec."""

    code = 76
    name = "UNSUPPORTED_COMPRESSION_TYPE"
    retriable = False
    description = "The request version cannot read the partition's codec."


class StaleBrokerEpochError(BrokerResponseError):
    """The broker epoch in the request is outdated."""

    code = 77
    name = "STALE_BROKER_EPOCH"
    retriable = False
    description = "The broker epoch in the request is outdated."


class OffsetNotAvailableError(BrokerResponseError):
    """The offset is not available yet, e.g. right after a leader change."""

    code = 78
    name = "OFFSET_NOT_AVAILABLE"
    retriable = True
    description = "The offset is not available yet, e.g. right after a leader change."


class MemberIdRequiredError(BrokerResponseError):
    """The member must rejoin with the member id the coordinator assigned."""

    code = 79
    name = "MEMBER_ID_REQUIRED"
    retriable = False
    description = "The member must rejoin with the member id the coordinator assigned."


class PreferredLeaderNotAvailableError(BrokerResponseError):
    """The preferred replica cannot become leader at the moment."""

    code = 80
    name = "PREFERRED_LEADER_NOT_AVAILABLE"
    retriable = True
    description = "The preferred replica cannot become leader at the moment."


class GroupMaxSizeReachedError(BrokerResponseError):
    """The group has reached its maximum size."""

    code = 81
    name = "GROUP_MAX_SIZE_REACHED"
    retriable = False
    description = "The group has reached its maximum size."


class FencedInstanceIdError(BrokerResponseError):
    """Another member with the same group instance id fenced this one."""

    code = 82
    name = "FENCED_INSTANCE_ID"
    retriable = False
    description = "Another member with the same group instance id fenced this one."


class EligibleLeadersNotAvailableError(BrokerResponseError):
    """No eligible replica can be elected leader."""

    code = 83
    name = "ELIGIBLE_LEADERS_NOT_AVAILABLE"
    retriable = True
    description = "No eligible replica can be elected leader."


class ElectionNotNeededError(BrokerResponseError):
    """The leader election is not needed."""

    code = 84
    name = "ELECTION_NOT_NEEDED"
    retriable = True
    description = "The leader election is not needed."


class NoReassignmentInProgressError(BrokerResponseError):
    """There is no ongoing partition reassignment to act on."""

    code = 85
    name = "NO_REASSIGNMENT_IN_PROGRESS"
    retriable = False
    description = "There is no ongoing partition reassignment to act on."


class GroupSubscribedToTopicError(BrokerResponseError):
    """The group is still subscribed to the topic."""

    code = 86
    name = "GROUP_SUBSCRIBED_TO_TOPIC"
    retriable = False
    description = "The group is still subscribed to the topic."


class InvalidRecordError(BrokerResponseError):
    """The broker rejected a record as invalid."""

    code = 87
    name = "INVALID_RECORD"
    retriable = False
    description = "The broker rejected a record as invalid."


class UnstableOffsetCommitError(BrokerResponseError):
    """Pending transactional offset commits make the offset unstable."""

    code = 88
    name = "UNSTABLE_OFFSET_COMMIT"
    retriable = True
    description = "Pending transactional offset commits make the offset unstable."


class ThrottlingQuotaExceededError(BrokerResponseError):
    """The request exceeded a throttling quota."""

    code = 89
    name = "THROTTLING_QUOTA_EXCEEDED"
    retriable = True
    description = "The request exceeded a throttling quota."


class ProducerFencedError(BrokerResponseError):
    """A newer producer with the same transactional id fenced this one."""

    code = 90
    name = "PRODUCER_FENCED"
    retriable = False
    description = "A newer producer with the same transactional id fenced this one."


class ResourceNotFoundError(BrokerResponseError):
    """The requested resource does not exist."""

    code = 91
    name = "RESOURCE_NOT_FOUND"
    retriable = False
    description = "The requested resource does not exist."


class DuplicateResourceError(BrokerResponseError):
    """The request names the same resource more than once."""

    code = 92
    name = "DUPLICATE_RESOURCE"
    retriable = False
    description = "The request names the same resource more than once."


class UnacceptableCredentialError(BrokerResponseError):
    """The credential does not meet the broker's requirements."""

    code = 93
    name = "UNACCEPTABLE_CREDENTIAL"
    retriable = False
    description = "The credential does not meet the broker's requirements."


class InconsistentVoterSetError(BrokerResponseError):
    """The voter is not part of the expected quorum voter set."""

    code = 94
    name = "INCONSISTENT_VOTER_SET"
    retriable = False
    description = "The voter is not part of the expected quorum voter set."


class InvalidUpdateVersionError(BrokerResponseError):
    """The update version is not valid."""

    code = 95
    name = "INVALID_UPDATE_VERSION"
    retriable = False
    description = "The update version is not valid."


class FeatureUpdateFailedError(BrokerResponseError):
    """Applying a feature update failed."""

    code = 96
    name = "FEATURE_UPDATE_FAILED"
    retriable = False
    description = "Applying a feature update failed."


class PrincipalDeserializationFailureError(BrokerResponseError):
    """A forwarded request's principal could not be decoded."""

    code = 97
    name = "PRINCIPAL_DESERIALIZATION_FAILURE"
    retriable = False
    description = "A forwarded request's principal could not be decoded."


class SnapshotNotFoundError(BrokerResponseError):
    """The requested snapshot does not exist."""

    code = 98
    name = "SNAPSHOT_NOT_FOUND"
    retriable = False
    description = "The requested snapshot does not exist."


class UnknownTopicIdError(BrokerResponseError):
    """The broker does not know this topic id."""

    code = 100
    name = "UNKNOWN_TOPIC_ID"
    retriable = True
    invalid_metadata = True
    description = "The broker does not know this topic id."


class DuplicateBrokerRegistrationError(BrokerResponseError):
    """Another broker already registered with this id."""

    code = 101
    name = "DUPLICATE_BROKER_REGISTRATION"
    retriable = False
    description = "Another broker already registered with this id."


class BrokerIdNotRegisteredError(BrokerResponseError):
    """This broker id is not registered."""

    code = 102
    name = "BROKER_ID_NOT_REGISTERED"
    retriable = False
    description = "This broker id is not registered."


class InconsistentTopicIdError(BrokerResponseError):
    """The topic id does not match the one in the broker's log."""

    code = 103
    name = "INCONSISTENT_TOPIC_ID"
    retriable = True
    invalid_metadata = True
    description = "The topic id does not match the one in the broker's log."


class InconsistentClusterIdError(BrokerResponseError):
    """The cluster id does not match the quorum's."""

    code = 104
    name = "INCONSISTENT_CLUSTER_ID"
    retriable = False
    description = "The cluster id does not match the quorum's."


class TransactionalIdNotFoundError(BrokerResponseError):
    """The transactional id does not exist."""

    code = 105
    name = "TRANSACTIONAL_ID_NOT_FOUND"
    retriable = False
    description = "The transactional id does not exist."


class FetchSessionTopicIdError(BrokerResponseError):
    """The fetch session's topic ids are inconsistent."""

    code = 106
    name = "FETCH_SESSION_TOPIC_ID_ERROR"
    retriable = True
    description = "The fetch session's topic ids are inconsistent."


class IneligibleReplicaError(BrokerResponseError):
    """A proposed in-sync replica is not eligible."""

    code = 107
    name = "INELIGIBLE_REPLICA"
    retriable = False
    description = "A proposed in-sync replica is not eligible."


class NewLeaderElectedError(BrokerResponseError):
    """The partition state changed, but leadership moved meanwhile."""

    code = 108
    name = "NEW_LEADER_ELECTED"
    retriable = False
    description = "The partition state changed, but leadership moved meanwhile."


class OffsetMovedToTieredStorageError(BrokerResponseError):
    """The offset is only in tiered (remote) storage."""

    code = 109
    name = "OFFSET_MOVED_TO_TIERED_STORAGE"
    retriable = False
    description = "The offset is only in tiered (remote) storage."


class FencedMemberEpochError(BrokerResponseError):
    """The coordinator fenced the member epoch."""

    code = 110
    name = "FENCED_MEMBER_EPOCH"
    retriable = False
    description = "The coordinator fenced the member epoch."


class UnreleasedInstanceIdError(BrokerResponseError):
    """The group instance id is still held by another member."""

    code = 111
    name = "UNRELEASED_INSTANCE_ID"
    retriable = False
    description = "The group instance id is still held by another member."


class UnsupportedAssignorError(BrokerResponseError):
    """The group does not support the requested assignor."""

    code = 112
    name = "UNSUPPORTED_ASSIGNOR"
    retriable = False
    description = "The group does not support the requested assignor."


class StaleMemberEpochError(BrokerResponseError):
    """The member epoch is outdated."""

    code = 113
    name = "STALE_MEMBER_EPOCH"
    retriable = False
    description = "The member epoch is outdated."


class MismatchedEndpointTypeError(BrokerResponseError):
    """The request was sent to the wrong endpoint type."""

    code = 114
    name = "MISMATCHED_ENDPOINT_TYPE"
    retriable = False
    description = "The request was sent to the wrong endpoint type."


class UnsupportedEndpointTypeError(BrokerResponseError):
    """The endpoint does not support this request."""

    code = 115
    name = "UNSUPPORTED_ENDPOINT_TYPE"
    retriable = False
    description = "The endpoint does not support this request."


class UnknownControllerIdError(BrokerResponseError):
    """No controller with this id is known."""

    code = 116
    name = "UNKNOWN_CONTROLLER_ID"
    retriable = False
    description = "No controller with this id is known."


class UnknownSubscriptionIdError(BrokerResponseError):
    """The client telemetry subscription id is unknown."""

    code = 117
    name = "UNKNOWN_SUBSCRIPTION_ID"
    retriable = False
    description = "The client telemetry subscription id is unknown."


class TelemetryTooLargeError(BrokerResponseError):
    """The client telemetry payload is too large."""

    code = 118
    name = "TELEMETRY_TOO_LARGE"
    retriable = False
    description = "The client telemetry payload is too large."


class InvalidRegistrationError(BrokerResponseError):
    """The controller rejected the broker registration."""

    code = 119
    name = "INVALID_REGISTRATION"
    retriable = False
    description = "The controller rejected the broker registration."


class BrokerTransactionAbortableError(BrokerResponseError):
    """The transaction must be aborted; the producer may then go on."""

    code = 120
    name = "TRANSACTION_ABORTABLE"
    retriable = False
    description = "The transaction must be aborted; the producer may then go on."


class InvalidRecordStateError(BrokerResponseError):
    """The share-group record's state forbids this operation."""

    code = 121
    name = "INVALID_RECORD_STATE"
    retriable = False
    description = "The share-group record's state forbids this operation."


class ShareSessionNotFoundError(BrokerResponseError):
    """The share session is unknown to the broker."""

    code = 122
    name = "SHARE_SESSION_NOT_FOUND"
    retriable = True
    description = "The share session is unknown to the broker."


class InvalidShareSessionEpochError(BrokerResponseError):
    """The share session epoch is not the expected one."""

    code = 123
    name = "INVALID_SHARE_SESSION_EPOCH"
    retriable = True
    description = "The share session epoch is not the expected one."


class FencedStateEpochError(BrokerResponseError):
    """The share-group state epoch is outdated."""

    code = 124
    name = "FENCED_STATE_EPOCH"
    retriable = False
    description = "The share-group state epoch is outdated."


class InvalidVoterKeyError(BrokerResponseError):
    """The voter's directory id differs from the receiving replica's."""

    code = 125
    name = "INVALID_VOTER_KEY"
    retriable = False
    description = "The voter's directory id differs from the receiving replica's."


class DuplicateVoterError(BrokerResponseError):
    """The voter to add is already in the quorum."""

    code = 126
    name = "DUPLICATE_VOTER"
    retriable = False
    description = "The voter to add is already in the quorum."


class VoterNotFoundError(BrokerResponseError):
    """The voter to remove is not in the quorum."""

    code = 127
    name = "VOTER_NOT_FOUND"
    retriable = False
    description = "The voter to remove is not in the quorum."


class InvalidRegularExpressionError(BrokerResponseError):
    """A topic regular expression in the request cannot be parsed."""

    code = 128
    name = "INVALID_REGULAR_EXPRESSION"
    retriable = False
    description = "A topic regular expression in the request cannot be parsed."


#: Exception class for every known non-zero protocol error code.
ERRORS_BY_CODE: Final[Mapping[int, type[BrokerResponseError]]] = MappingProxyType(
    {
        -1: UnknownServerError,
        1: OffsetOutOfRangeError,
        2: CorruptMessageError,
        3: UnknownTopicOrPartitionError,
        4: InvalidFetchSizeError,
        5: LeaderNotAvailableError,
        6: NotLeaderOrFollowerError,
        7: RequestTimedOutError,
        8: BrokerNotAvailableError,
        9: ReplicaNotAvailableError,
        10: MessageTooLargeError,
        11: StaleControllerEpochError,
        12: OffsetMetadataTooLargeError,
        13: NetworkError,
        14: CoordinatorLoadInProgressError,
        15: CoordinatorNotAvailableError,
        16: NotCoordinatorError,
        17: InvalidTopicError,
        18: RecordListTooLargeError,
        19: NotEnoughReplicasError,
        20: NotEnoughReplicasAfterAppendError,
        21: InvalidRequiredAcksError,
        22: IllegalGenerationError,
        23: InconsistentGroupProtocolError,
        24: InvalidGroupIdError,
        25: UnknownMemberIdError,
        26: InvalidSessionTimeoutError,
        27: RebalanceInProgressError,
        28: InvalidCommitOffsetSizeError,
        29: TopicAuthorizationFailedError,
        30: GroupAuthorizationFailedError,
        31: ClusterAuthorizationFailedError,
        32: InvalidTimestampError,
        33: UnsupportedSaslMechanismError,
        34: IllegalSaslStateError,
        35: BrokerUnsupportedVersionError,
        36: TopicAlreadyExistsError,
        37: InvalidPartitionsError,
        38: InvalidReplicationFactorError,
        39: InvalidReplicaAssignmentError,
        40: InvalidConfigError,
        41: NotControllerError,
        42: InvalidRequestError,
        43: UnsupportedForMessageFormatError,
        44: PolicyViolationError,
        45: OutOfOrderSequenceNumberError,
        46: DuplicateSequenceNumberError,
        47: InvalidProducerEpochError,
        48: InvalidTxnStateError,
        49: InvalidProducerIdMappingError,
        50: InvalidTransactionTimeoutError,
        51: ConcurrentTransactionsError,
        52: TransactionCoordinatorFencedError,
        53: TransactionalIdAuthorizationFailedError,
        54: SecurityDisabledError,
        55: OperationNotAttemptedError,
        56: KafkaStorageError,
        57: LogDirNotFoundError,
        58: SaslAuthenticationFailedError,
        59: UnknownProducerIdError,
        60: ReassignmentInProgressError,
        61: DelegationTokenAuthDisabledError,
        62: DelegationTokenNotFoundError,
        63: DelegationTokenOwnerMismatchError,
        64: DelegationTokenRequestNotAllowedError,
        65: DelegationTokenAuthorizationFailedError,
        66: DelegationTokenExpiredError,
        67: InvalidPrincipalTypeError,
        68: NonEmptyGroupError,
        69: GroupIdNotFoundError,
        70: FetchSessionIdNotFoundError,
        71: InvalidFetchSessionEpochError,
        72: ListenerNotFoundError,
        73: TopicDeletionDisabledError,
        74: FencedLeaderEpochError,
        75: UnknownLeaderEpochError,
        76: UnsupportedCompressionTypeError,
        77: StaleBrokerEpochError,
        78: OffsetNotAvailableError,
        79: MemberIdRequiredError,
        80: PreferredLeaderNotAvailableError,
        81: GroupMaxSizeReachedError,
        82: FencedInstanceIdError,
        83: EligibleLeadersNotAvailableError,
        84: ElectionNotNeededError,
        85: NoReassignmentInProgressError,
        86: GroupSubscribedToTopicError,
        87: InvalidRecordError,
        88: UnstableOffsetCommitError,
        89: ThrottlingQuotaExceededError,
        90: ProducerFencedError,
        91: ResourceNotFoundError,
        92: DuplicateResourceError,
        93: UnacceptableCredentialError,
        94: InconsistentVoterSetError,
        95: InvalidUpdateVersionError,
        96: FeatureUpdateFailedError,
        97: PrincipalDeserializationFailureError,
        98: SnapshotNotFoundError,
        100: UnknownTopicIdError,
        101: DuplicateBrokerRegistrationError,
        102: BrokerIdNotRegisteredError,
        103: InconsistentTopicIdError,
        104: InconsistentClusterIdError,
        105: TransactionalIdNotFoundError,
        106: FetchSessionTopicIdError,
        107: IneligibleReplicaError,
        108: NewLeaderElectedError,
        109: OffsetMovedToTieredStorageError,
        110: FencedMemberEpochError,
        111: UnreleasedInstanceIdError,
        112: UnsupportedAssignorError,
        113: StaleMemberEpochError,
        114: MismatchedEndpointTypeError,
        115: UnsupportedEndpointTypeError,
        116: UnknownControllerIdError,
        117: UnknownSubscriptionIdError,
        118: TelemetryTooLargeError,
        119: InvalidRegistrationError,
        120: BrokerTransactionAbortableError,
        121: InvalidRecordStateError,
        122: ShareSessionNotFoundError,
        123: InvalidShareSessionEpochError,
        124: FencedStateEpochError,
        125: InvalidVoterKeyError,
        126: DuplicateVoterError,
        127: VoterNotFoundError,
        128: InvalidRegularExpressionError,
    }
)
# END GENERATED


def error_for_code(code: int, message: str | None = None) -> BrokerResponseError:
    """Return an exception instance for a non-zero broker ``error_code``.

    ``message`` is the optional error message of the response. A code missing from
    :data:`ERRORS_BY_CODE` gives an :class:`UnknownBrokerError` carrying that code. Code 0
    (NONE) means success and raises ``ValueError``.
    """
    if code == 0:
        raise ValueError("error code 0 (NONE) means success, not an error")
    cls = ERRORS_BY_CODE.get(code)
    if cls is None:
        return UnknownBrokerError(code, message)
    return cls(message)


def has_cause(error: BaseException | None, matches: Callable[[BaseException], bool]) -> bool:
    """``error`` or an exception of its ``__cause__`` chain ``matches``.

    An error keeps what it wraps as its cause (a fatal error its broker answer, a timeout the
    fencing that led to it): what a caller decides on may be any link of the chain.
    """
    seen: set[int] = set()
    while error is not None and id(error) not in seen:  # a chain may loop (an error its own cause)
        if matches(error):
            return True
        seen.add(id(error))
        error = error.__cause__
    return False
