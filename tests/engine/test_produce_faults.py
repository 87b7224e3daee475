"""The producer without transactions under random faults: a few seeds of tests/engine/produce_faults.py.

Each seed draws the settings (idempotence on or off, acks, in-flight limit, linger, small batches
and buffer, compression, timeouts, retries), sends over several partitions of three brokers under
random produce faults in virtual time, closes, and checks that every future resolved, nothing is
written twice (with idempotence), acknowledged records are in order and where their offsets say
(seed 45: a broker without state for the producer takes a later batch ahead of refused ones),
no error says "not written" of a record in the log, memory is all given back, the metrics agree,
and records of a batch refused for some of them (KIP-467) fail as the broker said (seed 16: parts
of split batches so refused, with idempotence). Those seeds run as they were chosen, without
broken answers; seeds 15, 108 (idempotence on, off) draw produce answers missing, repeating or
misnaming a partition, InitProducerId answers without an id and metadata with partition ids out of
range, seed 24 the cluster replaced twice behind the same addresses (the checks then: see
produce_faults.Run.check), seed 115 a batch numbered under the old cluster's producer id retried
after a replacement (taken for the new cluster's own producer's duplicate, before it was renumbered).
"""

from __future__ import annotations

import pytest

from tests.engine.fault_runs import check_seed
from tests.engine.produce_faults import run_seed


@pytest.mark.parametrize("seed", [0, 4, 13, 16, 37, 39, 45])
def test_the_producer_keeps_its_promises_under_random_faults(seed: int) -> None:
    check_seed(lambda seed: run_seed(seed, broken=False), seed)


@pytest.mark.parametrize("seed", [15, 108, 24, 115])
def test_the_producer_keeps_its_promises_under_broken_answers(seed: int) -> None:
    check_seed(run_seed, seed)
