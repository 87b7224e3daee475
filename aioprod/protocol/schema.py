"""Declarative message schemas and the codec compiled from them.

Messages are dataclasses whose fields carry their wire type and version ranges as
metadata (:func:`field`). For each (message, version) pair the schema is compiled once
into a flat list of encoder/decoder closures, so encoding a request walks no metadata.
The declarations are checked against Kafka's JSON specs by ``tests/protocol/test_spec_drift.py``.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple, TypeVar

from aioprod.errors import ProtocolError, UnsupportedVersionError
from aioprod.protocol import primitives as p
from aioprod.protocol.primitives import Reader

Encoder = Callable[[bytearray, Any], None]
Decoder = Callable[[Reader], Any]

ZERO_UUID = uuid.UUID(int=0)


class VersionRange:
    """A version range as the specs write it: ``"3+"``, ``"0-2"``, ``"5"`` or ``"none"``."""

    __slots__ = ("high", "low", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        if text == "none":
            self.low, self.high = 1, 0
        elif text.endswith("+"):
            self.low, self.high = int(text[:-1]), 1 << 15
        elif "-" in text:
            low, high = text.split("-")
            self.low, self.high = int(low), int(high)
        else:
            self.low = self.high = int(text)

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and self.low <= version <= self.high

    def __repr__(self) -> str:
        return f"VersionRange({self.text!r})"


class WireType:
    """A field's wire type; compiles into an encoder/decoder for one version."""

    name: str

    def codec(self, version: int, flexible: bool, nullable: bool) -> tuple[Encoder, Decoder]:
        raise NotImplementedError

    def default(self) -> Any:
        return None

    def __repr__(self) -> str:
        return self.name


class _Fixed(WireType):
    def __init__(
        self, name: str, enc: Callable[[bytearray, Any], None], dec: Callable[[Reader], Any], zero: Any
    ) -> None:
        self.name, self._enc, self._dec, self._zero = name, enc, dec, zero

    def codec(self, version: int, flexible: bool, nullable: bool) -> tuple[Encoder, Decoder]:
        return self._enc, self._dec

    def default(self) -> Any:
        return self._zero


INT8 = _Fixed("int8", p.write_int8, Reader.int8, 0)
INT16 = _Fixed("int16", p.write_int16, Reader.int16, 0)
UINT16 = _Fixed("uint16", p.write_uint16, Reader.uint16, 0)
INT32 = _Fixed("int32", p.write_int32, Reader.int32, 0)
INT64 = _Fixed("int64", p.write_int64, Reader.int64, 0)
FLOAT64 = _Fixed("float64", p.write_float64, Reader.float64, 0.0)
BOOL = _Fixed("bool", p.write_bool, Reader.bool, False)
UUID = _Fixed("uuid", p.write_uuid, Reader.uuid, ZERO_UUID)


class _String(WireType):
    name = "string"

    def codec(self, version: int, flexible: bool, nullable: bool) -> tuple[Encoder, Decoder]:
        def enc(out: bytearray, value: str | None) -> None:
            p.write_string(out, value, compact=flexible, nullable=nullable)

        def dec(r: Reader) -> str | None:
            return r.string(compact=flexible, nullable=nullable)

        return enc, dec

    def default(self) -> Any:
        return ""


class _Bytes(WireType):
    def __init__(self, name: str) -> None:
        self.name = name

    def codec(self, version: int, flexible: bool, nullable: bool) -> tuple[Encoder, Decoder]:
        def enc(out: bytearray, value: bytes | None) -> None:
            p.write_bytes(out, value, compact=flexible, nullable=nullable)

        def dec(r: Reader) -> bytes | None:
            return r.bytes(compact=flexible, nullable=nullable)

        return enc, dec

    def default(self) -> Any:
        return b""


STRING = _String()
BYTES = _Bytes("bytes")
#: A record batch payload; kept as opaque bytes here (see ``protocol.records``).
RECORDS = _Bytes("records")


class Array(WireType):
    def __init__(self, item: WireType | type[Struct]) -> None:
        self.item: WireType = item if isinstance(item, WireType) else StructType(item)
        self.name = f"[]{self.item.name}"

    def codec(self, version: int, flexible: bool, nullable: bool) -> tuple[Encoder, Decoder]:
        item_enc, item_dec = self.item.codec(version, flexible, False)

        def enc(out: bytearray, value: list[Any] | None) -> None:
            if value is None:
                p.write_array_length(out, None, compact=flexible, nullable=nullable)
                return
            p.write_array_length(out, len(value), compact=flexible, nullable=nullable)
            for item in value:
                item_enc(out, item)

        def dec(r: Reader) -> list[Any] | None:
            n = r.array_length(compact=flexible, nullable=nullable)
            if n is None:
                return None
            return [item_dec(r) for _ in range(n)]

        return enc, dec


class StructType(WireType):
    def __init__(self, cls: type[Struct]) -> None:
        self.cls = cls
        self.name = cls.__name__

    def codec(self, version: int, flexible: bool, nullable: bool) -> tuple[Encoder, Decoder]:
        return struct_codec(self.cls, version, flexible)


@dataclasses.dataclass(frozen=True, slots=True)
class FieldSpec:
    type: WireType
    versions: VersionRange
    nullable: VersionRange
    tagged: VersionRange
    tag: int | None
    #: False (the spec's ``"ignorable": false`` where it matters): a non-default value cannot be
    #: silently left out at a version without the field; encoding raises instead, as Java does.
    ignorable: bool = True


def field(
    type_: WireType | type[Struct],
    versions: str = "0+",
    *,
    nullable: str = "none",
    tagged: str = "none",
    tag: int | None = None,
    default: Any = dataclasses.MISSING,
    ignorable: bool = True,
    secret: bool = False,
) -> Any:
    """Declare a message field: its wire type, versions, nullability and tag. A ``secret``
    field (credentials) is left out of the message's repr, which logs and tracebacks show."""
    wire = type_ if isinstance(type_, WireType) else StructType(type_)
    spec = FieldSpec(wire, VersionRange(versions), VersionRange(nullable), VersionRange(tagged), tag, ignorable)
    meta = {"kafka": spec}
    shown = not secret
    if default is not dataclasses.MISSING:
        return dataclasses.field(default=default, metadata=meta, repr=shown)
    if isinstance(wire, Array):
        return dataclasses.field(default_factory=list, metadata=meta, repr=shown)
    if isinstance(wire, StructType):
        return dataclasses.field(default_factory=wire.cls, metadata=meta, repr=shown)
    return dataclasses.field(default=wire.default(), metadata=meta, repr=shown)


class Struct:
    """Base of every declared message and nested structure."""

    __slots__ = ()


class Message(Struct):
    """A top-level request or response body."""

    __slots__ = ()
    API_KEY: ClassVar[int]
    MIN_VERSION: ClassVar[int]
    MAX_VERSION: ClassVar[int]
    #: First flexible version (compact encodings, tagged fields); None if never flexible.
    FLEXIBLE_FROM: ClassVar[int | None]

    @classmethod
    def is_flexible(cls, version: int) -> bool:
        return cls.FLEXIBLE_FROM is not None and version >= cls.FLEXIBLE_FROM


class Response(Message):
    __slots__ = ()


class Request(Message):
    __slots__ = ()
    RESPONSE: ClassVar[type[Response]]


S = TypeVar("S", bound=Struct)

_CODECS: dict[tuple[type[Struct], int, bool], tuple[Encoder, Decoder]] = {}


def field_specs(cls: type[Struct]) -> list[tuple[str, FieldSpec]]:
    return [(f.name, f.metadata["kafka"]) for f in dataclasses.fields(cls)]  # type: ignore[arg-type]


def struct_codec(cls: type[Struct], version: int, flexible: bool) -> tuple[Encoder, Decoder]:
    """The compiled encoder/decoder of ``cls`` at ``version`` (cached)."""
    key = (cls, version, flexible)
    cached = _CODECS.get(key)
    if cached is None:
        cached = _CODECS[key] = _compile(cls, version, flexible)
    return cached


class TaggedField(NamedTuple):
    name: str
    encode: Encoder
    decode: Decoder
    #: Written only when the value differs from this.
    default: Any


def tagged_fields(cls: type[Struct], version: int) -> dict[int, TaggedField]:
    """The tagged fields of ``cls`` at ``version``, a flexible one, by tag."""
    tagged = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        spec: FieldSpec = f.metadata["kafka"]
        if spec.tag is not None and version in spec.versions and version in spec.tagged:
            enc, dec = spec.type.codec(version, True, version in spec.nullable)
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            tagged[spec.tag] = TaggedField(f.name, enc, dec, default)
    return tagged


def read_tagged_fields(r: Reader, tagged: dict[int, TaggedField], values: dict[str, Any]) -> None:
    """Read a flexible struct's tagged fields into ``values``, by name; unknown tags are skipped."""
    for _ in range(r.unsigned_varint()):
        tag = r.unsigned_varint()
        size = r.unsigned_varint()
        if size > r.remaining:
            raise ProtocolError(f"tagged field {tag} claims {size} bytes, {r.remaining} remain")
        end = r.pos + size
        known = tagged.get(tag)
        if known is not None:
            sub = Reader(r.buf, r.pos, end)
            values[known.name] = known.decode(sub)
            if sub.pos != end:
                raise ProtocolError(f"tagged field {tag} has {end - sub.pos} unread bytes")
        r.pos = end


def _compile(cls: type[Struct], version: int, flexible: bool) -> tuple[Encoder, Decoder]:
    tagged = tagged_fields(cls, version) if flexible else {}
    tagged_names = {field.name for field in tagged.values()}
    regular: list[tuple[str, Encoder, Decoder]] = []
    absent: list[tuple[str, Any, str]] = []  # non-ignorable fields this version lacks
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        spec: FieldSpec = f.metadata["kafka"]
        if version in spec.versions and f.name not in tagged_names:
            enc, dec = spec.type.codec(version, flexible, version in spec.nullable)
            regular.append((f.name, enc, dec))
        elif version not in spec.versions and not spec.ignorable:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            absent.append((f.name, default, spec.versions.text))
    ordered_tags = sorted(tagged.items())

    def encode(out: bytearray, obj: Any) -> None:
        for name, default, needs in absent:
            if getattr(obj, name) != default:
                raise UnsupportedVersionError(
                    f"{cls.__name__}.{name}={getattr(obj, name)!r} cannot be sent at version {version} "
                    f"(the field needs versions {needs}): the broker is too old for it"
                )
        for name, enc, _ in regular:
            enc(out, getattr(obj, name))
        if not flexible:
            return
        if not ordered_tags:
            out.append(0)  # no tagged fields
            return
        present = []
        for tag, (name, enc, _, default) in ordered_tags:
            value = getattr(obj, name)
            if value != default:
                body = bytearray()
                enc(body, value)
                present.append((tag, body))
        p.write_unsigned_varint(out, len(present))
        for tag, body in present:
            p.write_unsigned_varint(out, tag)
            p.write_unsigned_varint(out, len(body))
            out += body

    def decode(r: Reader) -> Any:
        values = {name: dec(r) for name, _, dec in regular}
        if flexible:
            read_tagged_fields(r, tagged, values)
        return cls(**values)

    return encode, decode


def encode_struct(obj: Struct, version: int, flexible: bool) -> bytes:
    out = bytearray()
    struct_codec(type(obj), version, flexible)[0](out, obj)
    return bytes(out)


def decode_struct(cls: type[S], data: bytes | bytearray | memoryview, version: int, flexible: bool) -> S:
    """Decode exactly one ``cls`` from ``data``; trailing bytes are an error."""
    r = Reader(data)
    obj: S = struct_codec(cls, version, flexible)[1](r)
    if r.remaining:
        raise ProtocolError(f"{cls.__name__} v{version}: {r.remaining} trailing bytes")
    return obj
