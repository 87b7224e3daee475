"""The producer without transactions under random faults: a few seeds of tests/engine/produce_faults.py.

Each seed draws the settings (idempotence on or off, acks, in-flight limit, linger, small batches
and buffer, compression, timeouts, retries), sends over several partitions of three brokers under
random produce faults in virtual time, closes, and checks that every future resolved, nothing is
written twice (with idempotence), acknowledged records are in order and where their offsets say
(seed 45: a broker without state for the producer takes a later batch ahead of refused ones),
no error says "not written" of a record in the log, memory is all given back, the metrics agree,
and records of a batch refused for some of them (KIP-467) fail as the broker said (seed 16: parts
of split batches so refused, with idempotence).
"""

from __future__ import annotations

import pytest

from tests.engine.fault_runs import check_seed
from tests.engine.produce_faults import run_seed


@pytest.mark.parametrize("seed", [0, 4, 13, 16, 37, 39, 45])
def test_the_producer_keeps_its_promises_under_random_faults(seed: int) -> None:
    check_seed(run_seed, seed)
