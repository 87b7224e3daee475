"""Where the tests find Kafka's protocol reference (message specs, error table).

Always the pinned copy in ``tests/kafka_protocol`` (see its README); and the outside folder
``../shared/kafka-protocol`` beside the repository when it is present, or the folder named
by ``$AIOPROD_KAFKA_PROTOCOL_DIR`` (which must then exist), so that a newer reference shows
drift too.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "AIOPROD_KAFKA_PROTOCOL_DIR"
PINNED = Path(__file__).resolve().parent / "kafka_protocol"
OUTSIDE = Path(__file__).resolve().parents[2] / "shared" / "kafka-protocol"


def reference_dirs() -> dict[str, Path]:
    """``{"pinned": ..., "outside": ...}``, the second only when there is one."""
    found = {"pinned": PINNED}
    override = os.environ.get(ENV_VAR)
    if override:
        found["outside"] = Path(override)
    elif OUTSIDE.is_dir():
        found["outside"] = OUTSIDE
    return found
