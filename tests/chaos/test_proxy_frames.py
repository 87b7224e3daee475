"""The fault proxy's frame accounting, on which the restart with the data kept relies: the
broker is killed only once it has answered every whole request it was sent."""

from __future__ import annotations

import struct

from tests.chaos.proxy import _Frames


def frame(api_key: int, body: bytes = b"") -> bytes:
    payload = struct.pack(">h", api_key) + body
    return struct.pack(">i", len(payload)) + payload


def test_frames_are_counted_however_the_stream_is_cut() -> None:
    stream = frame(0, b"x" * 300) + frame(3) + struct.pack(">i", 0) + struct.pack(">i", 1) + b"z" + frame(18, b"y")
    expected = [0, 3, -1, -1, 18]
    for size in (1, 2, 3, 5, 7, 64, len(stream)):
        frames = _Frames()
        seen = [key for at in range(0, len(stream), size) for key in frames.feed(stream[at : at + size])]
        assert seen == expected, size


def test_a_frame_not_yet_whole_is_not_counted() -> None:
    frames = _Frames()
    whole = frame(0, b"x" * 10)
    assert frames.feed(whole[:-1]) == []
    assert frames.feed(whole[-1:] + whole[:3]) == [0]
