"""Every quarantined record has an owner: documented defaults (the domain's), overridable per error code."""

from __future__ import annotations

import pytest

from service.codes import ErrorCode
from service.orders.domain import DOMAIN
from service.policy.owners import owner_for, parse_owners

PRODUCERS, ONCALL = DOMAIN.owners.producers, DOMAIN.owners.oncall


@pytest.mark.parametrize(
    ("code", "owner"),
    [
        (ErrorCode.MALFORMED_PAYLOAD, PRODUCERS),
        (ErrorCode.SCHEMA_UNSUPPORTED, PRODUCERS),
        (ErrorCode.INVALID_FIELD, PRODUCERS),
        (ErrorCode.RATE_LIMITED_EXHAUSTED, ONCALL),
        (ErrorCode.UNEXPECTED_ERROR_EXHAUSTED, ONCALL),
    ],
)
def test_bad_input_belongs_to_producers_and_exhausted_retries_to_the_on_call(code: ErrorCode, owner: str) -> None:
    assert owner_for(code, DOMAIN.owners) == owner


def test_an_override_names_the_owner_of_one_code_and_leaves_the_others() -> None:
    overrides = parse_owners(" SCHEMA_UNSUPPORTED = schema-team , RATE_LIMITED_EXHAUSTED=payments-oncall")

    assert owner_for(ErrorCode.SCHEMA_UNSUPPORTED, DOMAIN.owners, overrides) == "schema-team"
    assert owner_for(ErrorCode.RATE_LIMITED_EXHAUSTED, DOMAIN.owners, overrides) == "payments-oncall"
    assert owner_for(ErrorCode.MALFORMED_PAYLOAD, DOMAIN.owners, overrides) == PRODUCERS


def test_the_order_domain_names_its_producers_and_its_on_call() -> None:
    assert (PRODUCERS, ONCALL) == ("order-producers", "order-service-oncall")


@pytest.mark.parametrize("text", ["NOPE=team", "SCHEMA_UNSUPPORTED=", "SCHEMA_UNSUPPORTED"])
def test_an_override_with_an_unknown_code_or_no_owner_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="CODE=owner"):
        parse_owners(text)
