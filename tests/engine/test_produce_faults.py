"""The producer without transactions under random faults: a few seeds of tests/engine/produce_faults.py.

Each seed draws the settings (idempotence on or off, acks, in-flight limit, linger, small batches
and buffer, compression, timeouts, retries), sends over several partitions of three brokers under
random produce faults in virtual time, closes, and checks that every future resolved, nothing is
written twice (with idempotence), acknowledged records are in order and where their offsets say
(seed 45: a broker without state for the producer takes a later batch ahead of refused ones),
no error says "not written" of a record in the log, memory is all given back, and the metrics agree.
"""

from __future__ import annotations

import asyncio
import random

import pytest

import aioprod.producer.producer as producer_module
from tests.engine.produce_faults import run_seed


@pytest.mark.parametrize("seed", [0, 4, 13, 16, 37, 39, 45])
def test_the_producer_keeps_its_promises_under_random_faults(seed: int) -> None:
    state, connect, now_ms = random.getstate(), asyncio.open_connection, producer_module._now_ms
    run = run_seed(seed)
    assert not run.problems, "\n".join(run.problems + run.trace[-40:])
    # Nothing of the run outlives it: the random state, TCP, the record clock are the suite's again.
    assert random.getstate() == state
    assert asyncio.open_connection is connect
    assert producer_module._now_ms is now_ms
