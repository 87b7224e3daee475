"""Our message declarations against Kafka's JSON message specs, version by version.

The specs are read here and nowhere at runtime: the pinned copy in ``tests/kafka_protocol``,
and the outside reference (``../shared/kafka-protocol`` or ``$AIOPROD_KAFKA_PROTOCOL_DIR``)
when present (see ``tests/kafka_reference.py``). For each declared request/response class and
each version it declares, the field tree must equal the spec's: order, snake_case name, wire
type, nullability, taggedness and tag number, and default value, in both directions (nothing
missing, nothing extra).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import uuid
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from aioprod.protocol.messages import ALL_REQUESTS, InitProducerIdRequest, MetadataRequest, snake_case
from aioprod.protocol.schema import Array, FieldSpec, Message, Request, Response, Struct, StructType
from tests.kafka_reference import ENV_VAR, PINNED, reference_dirs
from tests.protocol.strategies import CASES, MESSAGE_CLASSES, case_id

PRIMITIVES = {
    "int8",
    "int16",
    "uint16",
    "int32",
    "int64",
    "float64",
    "bool",
    "string",
    "bytes",
    "records",
    "uuid",
}
INTEGERS = {"int8", "int16", "uint16", "int32", "int64"}

#: Versions Apache Kafka 4.0 added for transactions v2 (KIP-890 part 2) whose body is the
#: version before's — ProduceRequest.json @ 4.0: "Version 12 is the same as version 11";
#: TxnOffsetCommitRequest.json: "Version 5 is the same as version 4" (likewise their
#: responses). The pinned specs predate them, so each is checked against the version before.
SAME_AS_PREVIOUS = {("Produce", 12): 11, ("TxnOffsetCommit", 5): 4}

#: The APIs and version ranges this client is meant to speak.
EXPECTED_RANGES = {
    "ApiVersions": (0, 4),
    "Metadata": (1, 12),
    "Produce": (3, 12),
    "InitProducerId": (0, 5),
    "ListOffsets": (1, 10),
    "CreateTopics": (2, 7),
    "FindCoordinator": (0, 6),
    "AddPartitionsToTxn": (0, 5),
    "AddOffsetsToTxn": (0, 4),
    "TxnOffsetCommit": (0, 5),
    "EndTxn": (0, 5),
    "OffsetFetch": (2, 9),
    "SaslHandshake": (0, 1),
    "SaslAuthenticate": (0, 2),
}


REFERENCES = reference_dirs()


@pytest.fixture(params=list(REFERENCES))
def reference(request: pytest.FixtureRequest) -> Path:
    """The root of one protocol reference: the pinned copy, then the outside one if present."""
    root: Path = REFERENCES[request.param]
    if not (root / "message").is_dir():
        pytest.fail(f"Kafka message specs not found at {root / 'message'} (from ${ENV_VAR})", pytrace=False)
    return root


@cache
def load_spec(name: str, root: Path = PINNED) -> dict[str, Any]:
    path = root / "message" / f"{name}.json"
    if not path.is_file():
        pytest.fail(f"no spec file {path} for {name}", pytrace=False)
    text = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("//"))
    spec: dict[str, Any] = json.loads(text)
    return spec


def in_range(text: str | None, version: int) -> bool:
    """Whether ``version`` is in a spec version string (``"3+"``, ``"0-2"``, ``"5"``, ``"none"``)."""
    if text is None or text == "none":
        return False
    if text.endswith("+"):
        return version >= int(text[:-1])
    if "-" in text:
        low, high = text.split("-")
        return int(low) <= version <= int(high)
    return version == int(text)


def range_bounds(text: str) -> tuple[int, int | None]:
    if text.endswith("+"):
        return int(text[:-1]), None
    if "-" in text:
        low, high = text.split("-")
        return int(low), int(high)
    return int(text), int(text)


@dataclass(frozen=True)
class FieldDesc:
    """What a field looks like on the wire at one version."""

    name: str
    type: str  # a primitive name, "struct", or either prefixed with "[]"
    nullable: bool
    tagged: bool
    tag: int | None
    default: Any
    children: tuple[FieldDesc, ...] | None

    def attributes(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "nullable": self.nullable,
            "tagged": self.tagged,
            "tag": self.tag,
            "default": self.default,
        }


_NO_DEFAULT = "<struct>"  # struct-typed fields: their children's defaults are compared instead


def _spec_default(base: str, is_array: bool, raw: Any) -> Any:
    """The value a field takes when the spec's ``default`` is ``raw`` (None: not given)."""
    if base not in PRIMITIVES and not is_array:
        return _NO_DEFAULT
    if raw == "null":
        return None
    if is_array:
        return []
    if base in INTEGERS:
        return 0 if raw is None else int(str(raw), 0)
    if base == "float64":
        return 0.0 if raw is None else float(raw)
    if base == "bool":
        return False if raw is None else raw in (True, "true")
    if base == "string":
        return "" if raw is None else str(raw)
    if base in ("bytes", "records"):
        return b""
    assert base == "uuid", base
    return uuid.UUID(int=0) if raw is None else uuid.UUID(raw)


def _collect_structs(fields: list[dict[str, Any]], into: dict[str, list[dict[str, Any]]]) -> None:
    for f in fields:
        if "fields" in f:
            into[f["type"].removeprefix("[]")] = f["fields"]
            _collect_structs(f["fields"], into)


@cache
def spec_structs(name: str, root: Path = PINNED) -> dict[str, list[dict[str, Any]]]:
    spec = load_spec(name, root)
    structs: dict[str, list[dict[str, Any]]] = {}
    for common in spec.get("commonStructs", []):
        structs[common["name"]] = common["fields"]
        _collect_structs(common["fields"], structs)
    _collect_structs(spec["fields"], structs)
    return structs


def spec_fields(
    fields: list[dict[str, Any]], version: int, structs: dict[str, list[dict[str, Any]]]
) -> tuple[FieldDesc, ...]:
    out = []
    for f in fields:
        if not in_range(f["versions"], version):
            continue
        is_array = f["type"].startswith("[]")
        base = f["type"].removeprefix("[]")
        children = None
        if base not in PRIMITIVES:
            children = spec_fields(f.get("fields") or structs[base], version, structs)
        tagged = in_range(f.get("taggedVersions"), version)
        out.append(
            FieldDesc(
                name=snake_case(f["name"]),
                type=("[]" if is_array else "") + (base if base in PRIMITIVES else "struct"),
                nullable=in_range(f.get("nullableVersions"), version),
                tagged=tagged,
                tag=f.get("tag") if tagged else None,
                default=_spec_default(base, is_array, f.get("default")),
                children=children,
            )
        )
    return tuple(out)


def our_fields(cls: type[Struct], version: int, flexible: bool) -> tuple[FieldDesc, ...]:
    out = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        spec: FieldSpec = f.metadata["kafka"]
        if version not in spec.versions:
            continue
        wire = spec.type
        is_array = isinstance(wire, Array)
        item = wire.item if isinstance(wire, Array) else wire
        children = None
        if isinstance(item, StructType):
            kind = "struct"
            children = our_fields(item.cls, version, flexible)
            default: Any = _NO_DEFAULT if not is_array else _default_of(f)
        else:
            kind = item.name
            default = _default_of(f)
        # Tagged exactly when the compiled codec treats it as tagged.
        tagged = flexible and spec.tag is not None and version in spec.tagged
        out.append(
            FieldDesc(
                name=f.name,
                type=("[]" if is_array else "") + kind,
                nullable=version in spec.nullable,
                tagged=tagged,
                tag=spec.tag if tagged else None,
                default=default,
                children=children,
            )
        )
    return tuple(out)


def _default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def compare(ours: tuple[FieldDesc, ...], theirs: tuple[FieldDesc, ...], path: str) -> list[str]:
    problems = []
    our_names = [f.name for f in ours]
    their_names = [f.name for f in theirs]
    for name in their_names:
        if name not in our_names:
            problems.append(f"{path}: field {name!r} is in the spec but not declared")
    for name in our_names:
        if name not in their_names:
            problems.append(f"{path}: field {name!r} is declared but not in the spec")
    if not problems and our_names != their_names:
        problems.append(f"{path}: field order {our_names} differs from the spec's {their_names}")
    by_name = {f.name: f for f in theirs}
    for f in ours:
        other = by_name.get(f.name)
        if other is None:
            continue
        mine, spec = f.attributes(), other.attributes()
        for key in mine:
            if mine[key] != spec[key]:
                problems.append(f"{path}.{f.name}: {key} is {mine[key]!r}, the spec says {spec[key]!r}")
        if f.children is not None and other.children is not None:
            problems += compare(f.children, other.children, f"{path}.{f.name}")
    return problems


def test_the_pinned_copy_holds_the_specs_of_the_declared_apis() -> None:
    """Exactly the APIs the client speaks: a new one needs its specs pinned (tests/kafka_protocol)."""
    pinned = {path.stem for path in (PINNED / "message").glob("*.json")}
    assert pinned == {cls.__name__ for cls in MESSAGE_CLASSES}
    assert (PINNED / "LICENSE").is_file() and (PINNED / "NOTICE").is_file()


def test_declared_apis_and_ranges() -> None:
    declared = {req.__name__.removesuffix("Request"): (req.MIN_VERSION, req.MAX_VERSION) for req in ALL_REQUESTS}
    assert declared == EXPECTED_RANGES
    for req in ALL_REQUESTS:
        resp = req.RESPONSE
        assert resp.__name__ == req.__name__.removesuffix("Request") + "Response"
        assert (resp.API_KEY, resp.MIN_VERSION, resp.MAX_VERSION, resp.FLEXIBLE_FROM) == (
            req.API_KEY,
            req.MIN_VERSION,
            req.MAX_VERSION,
            req.FLEXIBLE_FROM,
        )
    assert len({req.API_KEY for req in ALL_REQUESTS}) == len(ALL_REQUESTS)


@pytest.mark.parametrize("cls", MESSAGE_CLASSES, ids=lambda c: c.__name__)
def test_header(cls: type[Message], reference: Path) -> None:
    spec = load_spec(cls.__name__, reference)
    assert spec["name"] == cls.__name__
    assert spec["apiKey"] == cls.API_KEY
    expected_type = "request" if issubclass(cls, Request) else "response"
    assert issubclass(cls, Request | Response)
    assert spec["type"] == expected_type
    low, high = range_bounds(spec["validVersions"])
    api = cls.__name__.removesuffix("Request").removesuffix("Response")
    ours = (cls.MIN_VERSION, SAME_AS_PREVIOUS.get((api, cls.MAX_VERSION), cls.MAX_VERSION))
    assert low <= ours[0] <= ours[1], (spec["validVersions"], ours)
    assert high is None or ours[1] <= high, (spec["validVersions"], ours)
    flexible = spec["flexibleVersions"]
    first_flexible = None if flexible == "none" else range_bounds(flexible)[0]
    declared_first_flexible = cls.FLEXIBLE_FROM
    assert declared_first_flexible == first_flexible


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_fields_match_spec(case: tuple[type[Message], int], reference: Path) -> None:
    cls, version = case
    spec = load_spec(cls.__name__, reference)
    version = SAME_AS_PREVIOUS.get((cls.__name__.removesuffix("Request").removesuffix("Response"), version), version)
    assert in_range(spec["validVersions"], version)
    flexible = in_range(spec["flexibleVersions"], version)
    assert cls.is_flexible(version) == flexible
    theirs = spec_fields(spec["fields"], version, spec_structs(cls.__name__, reference))
    ours = our_fields(cls, version, flexible)
    problems = compare(ours, theirs, f"{cls.__name__} v{version}")
    assert not problems, "\n".join(problems)


#: Fields the spec makes non-ignorable that a version without them drops on purpose: each is
#: half of a version-split pair, and callers fill both halves (the old versions' field and its
#: successor), so the version chosen carries one of them.
VERSION_SPLIT = {
    "FindCoordinatorRequest": {"key", "coordinator_keys"},
    "AddPartitionsToTxnRequest": {
        "transactions",
        "v3_and_below_transactional_id",
        "v3_and_below_producer_id",
        "v3_and_below_producer_epoch",
        "v3_and_below_topics",
    },
    "OffsetFetchRequest": {"group_id", "topics", "groups"},
}


def non_ignorable_dropped(cls: type[Request], spec: dict[str, Any]) -> list[str]:
    """Fields the spec makes non-ignorable that ``cls`` declares ignorable although some of its
    versions lack them (and so would drop a value silently there)."""
    ours = {f.name: f.metadata["kafka"] for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    ranged = [v for v in range(cls.MIN_VERSION, cls.MAX_VERSION + 1) if in_range(spec["validVersions"], v)]
    dropped = []
    for f in spec["fields"]:
        name = snake_case(f["name"])
        if f.get("ignorable") is True or all(in_range(f["versions"], v) for v in ranged):
            continue
        if not any(in_range(f["versions"], v) for v in ranged):
            continue  # only in versions this client does not speak (a newer reference's): never sent
        if ours[name].ignorable and name not in VERSION_SPLIT.get(cls.__name__, set()):
            dropped.append(name)
    return dropped


@pytest.mark.parametrize("cls", ALL_REQUESTS, ids=lambda c: c.__name__)
def test_a_field_the_spec_makes_non_ignorable_is_refused_where_a_version_lacks_it(
    cls: type[Request], reference: Path
) -> None:
    # Declared ignorable by default, such fields were dropped silently at versions without them
    # (allow_auto_topic_creation=False at Metadata v3: the broker auto-created the topic).
    dropped = non_ignorable_dropped(cls, load_spec(cls.__name__, reference))
    assert not dropped, f"{cls.__name__}: declared ignorable, non-ignorable in the spec: {dropped}"


def test_a_newer_reference_with_fields_of_versions_we_do_not_speak_is_no_drift() -> None:
    # Kafka 4.1's InitProducerIdRequest.json: "validVersions": "0-6", and v6 adds the
    # non-ignorable Enable2Pc and KeepPreparedTxn (KIP-939). This client speaks v0-v5: with the
    # outside reference moved to Kafka 4.1, the check crashed (KeyError: 'enable2_pc').
    spec = copy.deepcopy(load_spec("InitProducerIdRequest"))
    spec["validVersions"] = "0-6"
    spec["fields"] += [
        {"name": "Enable2Pc", "type": "bool", "versions": "6+", "default": "false"},
        {"name": "KeepPreparedTxn", "type": "bool", "versions": "6+", "default": "false"},
    ]
    assert non_ignorable_dropped(InitProducerIdRequest, spec) == []
    # The check itself still bites: a non-ignorable field of a spoken version declared ignorable.
    metadata = copy.deepcopy(load_spec("MetadataRequest"))
    lenient = dataclasses.replace(
        MetadataRequest.__dataclass_fields__["allow_auto_topic_creation"].metadata["kafka"], ignorable=True
    )
    with pytest.MonkeyPatch.context() as patch:
        field = MetadataRequest.__dataclass_fields__["allow_auto_topic_creation"]
        patch.setattr(field, "metadata", {"kafka": lenient})
        assert non_ignorable_dropped(MetadataRequest, metadata) == ["allow_auto_topic_creation"]


def test_snake_case_rule() -> None:
    assert snake_case("ThrottleTimeMs") == "throttle_time_ms"
    assert snake_case("ApiKey") == "api_key"
    assert snake_case("timeoutMs") == "timeout_ms"
    assert snake_case("V3AndBelowTopics") == "v3_and_below_topics"
    assert snake_case("ResultsByTopicV3AndBelow") == "results_by_topic_v3_and_below"
    assert snake_case("IsrNodes") == "isr_nodes"
    assert snake_case("TopicId") == "topic_id"


def test_comparison_catches_drift() -> None:
    """The checker itself: a swapped pair, a wrong tag and a missing field are all reported."""
    spec = load_spec("ProduceResponse")
    theirs = spec_fields(spec["fields"], 10, spec_structs("ProduceResponse"))
    assert not compare(theirs, theirs, "x")
    swapped = (theirs[1], theirs[0], *theirs[2:])
    assert any("order" in p for p in compare(swapped, theirs, "x"))
    retagged = (*theirs[:-1], dataclasses.replace(theirs[-1], tag=5))
    assert any("tag is 5" in p for p in compare(retagged, theirs, "x"))
    assert any("not declared" in p for p in compare(theirs[:-1], theirs, "x"))
