"""What the Spark writer checks on the driver, before any job."""

from __future__ import annotations

import pytest

from aioprod.errors import ConfigError
from aioprod.spark.plan import producer_options


@pytest.mark.parametrize("option", [{"acks": 1}, {"enable.idempotence": False}, {"retries": 0}])
def test_an_exactly_once_write_that_cannot_have_idempotence_says_so(option: dict[str, object]) -> None:
    # It blamed transactional_id, which the user did not set (and may not: it is refused).
    with pytest.raises(ConfigError, match=r"^exactly_once=True writes in transactions: "):
        producer_options("h:9092", option, exactly_once=True)


def test_a_mistake_of_the_options_own_is_said_as_it_is() -> None:
    with pytest.raises(ConfigError, match=r"^linger_ms must be"):
        producer_options("h:9092", {"linger_ms": -1}, exactly_once=True)


def test_the_plan_never_shows_a_password() -> None:
    # Its options held the password as given: repr(plan), in any traceback's locals, showed it.
    from aioprod.config import ProducerConfig
    from aioprod.spark.plan import Plan

    secret = "hunter2-plan-secret"
    jaas = f'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="{secret}";'
    for given in (
        {"sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": secret},
        {"sasl.jaas.config": jaas},
    ):
        options = producer_options("h:9092", {"security.protocol": "SASL_PLAINTEXT", **given})
        plan = Plan(options, "t", False, False, False, False, "raise", 0, 1, None)
        assert secret not in repr(plan)
        config = ProducerConfig.from_options(plan.options)  # what each writer builds from it
        assert config.sasl_password is not None and config.sasl_password.reveal() == secret
