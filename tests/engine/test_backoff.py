"""Exponential backoff (KIP-580): jitter spreads clients out but never passes the cap."""

from __future__ import annotations

import random

from aioprod.net.pool import exponential_backoff


def test_jitter_never_exceeds_the_maximum() -> None:
    rng_state = random.getstate()
    random.seed(1)
    try:
        samples = [exponential_backoff(0.1, 1.0, attempts) for attempts in range(1, 20) for _ in range(200)]
    finally:
        random.setstate(rng_state)
    assert max(samples) <= 1.0
    assert min(samples) >= 0.08
    # The cap is reached, and jitter still spreads values below it.
    capped = [exponential_backoff(0.1, 1.0, 30) for _ in range(200)]
    assert max(capped) == 1.0 and min(capped) < 0.9
