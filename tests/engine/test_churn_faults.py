"""The producer under cluster topology churn: a few seeds of tests/engine/churn_faults.py.

Each seed draws the settings and sends over three topics while leaders move (KIP-951 hints or
not), brokers fail, shut down, come back elsewhere, swap addresses or join, partitions are added,
topics are deleted and created again, and brokers' metadata lags; then checks that every future
resolved, nothing is written twice in a partition (with idempotence), acknowledged records are in
order and where their offsets say, no error says "not written" of a record in the log, memory is
all given back, the metrics agree, and no request loop runs without waiting (a storm). Those
seeds run as they were chosen, without broken answers; seeds 10 and 37 (idempotence on, off) draw
produce_faults.py's broken answers too (but a cluster replaced).
"""

from __future__ import annotations

import pytest

from tests.engine.churn_faults import run_seed
from tests.engine.fault_runs import check_seed


@pytest.mark.parametrize("seed", [0, 3, 7, 16, 38, 85, 89])
def test_the_producer_keeps_its_promises_under_topology_churn(seed: int) -> None:
    check_seed(lambda seed: run_seed(seed, broken=False), seed)


@pytest.mark.parametrize("seed", [10, 37])
def test_the_producer_keeps_its_promises_under_topology_churn_and_broken_answers(seed: int) -> None:
    check_seed(run_seed, seed)
