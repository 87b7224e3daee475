"""The public API from several tasks at once, cancelled anywhere: a few seeds of
tests/engine/concurrent_api.py (seeds 14 and 85: a cancelled close() of a transactional producer
left its abort retrying through the closed pool for transaction_timeout_ms)."""

from __future__ import annotations

import pytest

from tests.engine.concurrent_api import run_seed
from tests.engine.fault_runs import check_seed


@pytest.mark.parametrize("seed", [0, 2, 14, 18, 41, 85])
def test_the_api_keeps_its_promises_when_used_concurrently_and_cancelled(seed: int) -> None:
    check_seed(run_seed, seed)
