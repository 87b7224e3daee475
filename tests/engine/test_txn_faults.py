"""The transactional producer under random faults: a few seeds of tests/engine/txn_faults.py.

Each seed runs several transactions under random produce and coordinator faults in virtual
time and checks that a committed transaction holds exactly its acknowledged records (each
once, in order), an aborted one none, every future resolves, and every error tells the truth.
Seeds 0-5 run as they were chosen, without broken answers; seeds 14 and 37 (background sends and
close) draw them too: produce answers missing, repeating or misnaming a partition, FindCoordinator
answers naming no node, InitProducerId answers without an id, metadata with partition ids out of
range.
"""

from __future__ import annotations

import pytest

from tests.engine.txn_faults import run_seed


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("extra", [False, True], ids=["plain", "background-sends-and-close"])
def test_transactions_keep_their_promises_under_random_faults(seed: int, extra: bool) -> None:
    run = run_seed(seed, extra=extra, broken=False)
    assert not run.problems, "\n".join(run.problems + run.trace[-40:])


@pytest.mark.parametrize(("seed", "extra"), [(14, False), (37, True)])
def test_transactions_keep_their_promises_under_broken_answers(seed: int, extra: bool) -> None:
    run = run_seed(seed, extra=extra)
    assert not run.problems, "\n".join(run.problems + run.trace[-40:])
