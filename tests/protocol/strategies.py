"""Every declared message at every version, and Hypothesis strategies for its values.

The strategies are derived from the schema itself, so a new message is covered without new
test code (used by the round trips in test_messages.py and the fuzzing in test_schema.py).
"""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

from hypothesis import strategies as st

from aioprod.protocol import messages as m
from aioprod.protocol.schema import (
    Array,
    FieldSpec,
    Message,
    Struct,
    StructType,
    WireType,
)

MESSAGE_CLASSES: list[type[Message]] = [cls for req in m.ALL_REQUESTS for cls in (req, req.RESPONSE)]
CASES = [(cls, v) for cls in MESSAGE_CLASSES for v in range(cls.MIN_VERSION, cls.MAX_VERSION + 1)]


def case_id(case: tuple[type[Message], int]) -> str:
    return f"{case[0].__name__}-v{case[1]}"


def layout(cls: type[Struct], version: int) -> tuple[Any, ...]:
    """What the codec of ``cls`` at ``version`` is compiled from: each field present there, with its
    wire type, nullability and tag, nested structs likewise. The version reaches the codec only
    through these (and flexibility), so two versions with one layout encode alike."""

    def of_type(wire: WireType) -> Any:
        if isinstance(wire, Array):
            return ("array", of_type(wire.item))
        if isinstance(wire, StructType):
            return layout(wire.cls, version)
        return wire.name

    fields = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        spec: FieldSpec = f.metadata["kafka"]
        if version in spec.versions:
            tagged = version in spec.tagged
            fields.append((f.name, of_type(spec.type), version in spec.nullable, spec.tag if tagged else None))
    return tuple(fields)


def _split_by_layout() -> tuple[list[tuple[type[Message], int]], list[tuple[type[Message], int]]]:
    first: list[tuple[type[Message], int]] = []
    again: list[tuple[type[Message], int]] = []
    seen: set[Any] = set()
    for cls, version in CASES:
        key = (cls, cls.is_flexible(version), layout(cls, version))
        (again if key in seen else first).append((cls, version))
        seen.add(key)
    return first, again


#: CASES split: each message's first version of every layout, and the versions laid out as an
#: earlier one (which differ from it only in the version number a frame carries).
NEW_LAYOUT_CASES, REPEATED_LAYOUT_CASES = _split_by_layout()


# --- value strategies derived from the schema -------------------------------------------------

_INT_RANGES = {
    "int8": (-(1 << 7), (1 << 7) - 1),
    "int16": (-(1 << 15), (1 << 15) - 1),
    "uint16": (0, (1 << 16) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
}


def _int_strategy(name: str) -> st.SearchStrategy[int]:
    low, high = _INT_RANGES[name]
    return st.integers(low, high) | st.sampled_from([low, -1 if low else 0, 0, high])


def wire_strategy(wire: WireType, version: int, flexible: bool, nullable: bool) -> st.SearchStrategy[Any]:
    base: st.SearchStrategy[Any]
    if isinstance(wire, Array):
        base = st.lists(wire_strategy(wire.item, version, flexible, False), max_size=3)
    elif isinstance(wire, StructType):
        base = struct_strategy(wire.cls, version, flexible)
    elif wire.name in _INT_RANGES:
        base = _int_strategy(wire.name)
    elif wire.name == "float64":
        base = st.floats(allow_nan=False)
    elif wire.name == "bool":
        base = st.booleans()
    elif wire.name == "string":
        base = st.text(max_size=12)
    elif wire.name in ("bytes", "records"):
        base = st.binary(max_size=24)
    elif wire.name == "uuid":
        base = st.uuids()
    else:  # pragma: no cover - a new wire type needs a strategy here
        raise AssertionError(f"no strategy for {wire!r}")
    return st.none() | base if nullable else base


@cache
def struct_strategy(cls: type[Struct], version: int, flexible: bool) -> st.SearchStrategy[Any]:
    """Instances of ``cls`` valid at ``version``: absent fields keep their defaults."""
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        spec: FieldSpec = f.metadata["kafka"]
        if version in spec.versions:
            kwargs[f.name] = wire_strategy(spec.type, version, flexible, version in spec.nullable)
    return st.builds(cls, **kwargs)


def at_version(obj: Any, version: int) -> Any:
    """``obj`` as it reads back at ``version``: fields absent there take their defaults."""
    if isinstance(obj, list):
        return [at_version(item, version) for item in obj]
    if not isinstance(obj, Struct):
        return obj
    values = {}
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        spec: FieldSpec = f.metadata["kafka"]
        if version in spec.versions:
            values[f.name] = at_version(getattr(obj, f.name), version)
    return type(obj)(**values)


def message_strategy(cls: type[Message], version: int) -> st.SearchStrategy[Any]:
    return struct_strategy(cls, version, cls.is_flexible(version))


def mutate(data: st.DataObject, body: bytes) -> bytes:
    """``body`` with one to three bytes flipped, cut, inserted, deleted or made a huge length."""
    buf = bytearray(body)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        op = data.draw(st.sampled_from(["flip", "cut", "insert", "delete", "huge"]), label="op")
        at = data.draw(st.integers(0, len(buf)), label="at")
        if op == "flip" and buf:
            buf[min(at, len(buf) - 1)] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del buf[at:]
        elif op == "insert":
            buf[at:at] = data.draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del buf[at : at + data.draw(st.integers(1, 4))]
        elif op == "huge":
            buf[at : at + 4] = data.draw(
                st.sampled_from([b"\x7f\xff\xff\xff", b"\xff\xff\xff\xfe", b"\xff\xff\xff\x0f"])
            )
    return bytes(buf)
