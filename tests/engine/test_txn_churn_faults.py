"""The transactional producer under cluster topology churn: a few seeds of
tests/engine/txn_churn_faults.py.

Each seed runs transactions (sends, send_many, offsets, commits, aborts, retried or cancelled)
while leaders move, brokers fail, come back elsewhere, swap addresses or join, partitions are
added, topics deleted and created again, metadata lags, and the transaction coordinator moves
(NOT_COORDINATOR where it was, COORDINATOR_LOAD_IN_PROGRESS while the new one loads); then checks
what a read_committed reader sees: each committed transaction's acknowledged records once,
nothing of an aborted one, all or nothing of one whose outcome is unknown; and no call hangs.
"""

from __future__ import annotations

import pytest

from tests.engine.fault_runs import check_seed
from tests.engine.txn_churn_faults import run_seed


@pytest.mark.parametrize("seed", [1, 14, 22, 38, 172, 250])
def test_transactions_keep_their_promises_under_topology_churn(seed: int) -> None:
    check_seed(run_seed, seed)


@pytest.mark.parametrize("seed", [76, 89])
def test_background_sends_and_close_under_topology_churn(seed: int) -> None:
    check_seed(lambda s: run_seed(s, extra=True), seed)
