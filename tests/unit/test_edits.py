"""An edit's headers, diff and verdict, decided without I/O."""

from __future__ import annotations

import json

import pytest

from service.codes import ErrorCode
from service.orders.domain import DOMAIN
from service.policy.edits import EditRefused, HeaderChanges, diff, judge, parse_setting
from service.policy.handling import DecodeFailure

HEADERS = (("source", b"shop"), ("trace", b"a"), ("trace", b"b"))


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (HeaderChanges(set=(("source", "web"),)), (("source", b"web"), ("trace", b"a"), ("trace", b"b"))),
        (HeaderChanges(set=(("trace", "c"),)), (("source", b"shop"), ("trace", b"c"))),
        (HeaderChanges(drop=("trace",)), (("source", b"shop"),)),
        (HeaderChanges(set=(("new", "1"),)), (*HEADERS, ("new", b"1"))),
        (HeaderChanges(), HEADERS),
    ],
    ids=["replaced", "every value of a name replaced by one", "dropped", "added at the end", "unchanged"],
)
def test_header_changes_keep_the_order_of_the_headers(changes: HeaderChanges, expected: tuple[object, ...]) -> None:
    assert changes.apply(HEADERS) == expected


@pytest.mark.parametrize("name", ["message-id", "Failure-Id", "consumer", "reprocess-edit-id"])
def test_the_headers_a_copy_carries_of_its_own_cannot_be_edited(name: str) -> None:
    with pytest.raises(EditRefused, match="the service's own"):
        HeaderChanges(set=((name, "x"),)).apply(HEADERS)
    with pytest.raises(EditRefused, match="the service's own"):
        HeaderChanges(drop=(name,)).apply(HEADERS)


@pytest.mark.parametrize("given", ["novalue", "=x", " =x"])
def test_a_header_to_set_is_name_equals_value(given: str) -> None:
    with pytest.raises(EditRefused):
        parse_setting(given)


def test_a_header_value_may_hold_an_equals_sign() -> None:
    assert parse_setting("query=a=b") == ("query", "a=b")


def test_the_diff_shows_the_pretty_printed_payload_and_each_header_change() -> None:
    before = json.dumps({"order_id": "A", "items": [{"quantity": 0}]}).encode()
    after = json.dumps({"order_id": "A", "items": [{"quantity": 2}]}).encode()
    said = diff(before, after, HEADERS, (("source", b"web"), ("new", b"\x00\xff")))
    lines = said.splitlines()
    assert lines[:2] == ["--- payload (original)", "+++ payload (edited)"]
    assert '-      "quantity": 0' in lines
    assert '+      "quantity": 2' in lines
    assert 'header source: "shop" -> "web"' in lines
    assert 'header trace: dropped (was "a", "b")' in lines
    assert "header new: added (2 bytes that are not text)" in lines


def test_a_payload_that_is_not_json_is_diffed_as_text_and_an_unchanged_edit_has_an_empty_diff() -> None:
    assert "+not json either" in diff(b"not json", b"not json either", (), ()).splitlines()
    assert diff(b"{}", b"{}", HEADERS, HEADERS) == ""


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (b'{"schema": "order.placed.v1",', "MALFORMED_PAYLOAD"),
        (b'{"schema": "order.placed.v9", "order_id": "A"}', "SCHEMA_UNSUPPORTED"),
        (
            json.dumps(
                {
                    "schema": "order.placed.v1",
                    "order_id": "A",
                    "tenant": "acme",
                    "customer_id": "c",
                    "currency": "EUR",
                    "items": [{"sku": "s", "quantity": 0, "unit_price_cents": 1}],
                }
            ).encode(),
            "INVALID_FIELD",
        ),
    ],
)
def test_a_payload_the_consumer_would_quarantine_again_is_not_valid(payload: bytes, code: str) -> None:
    verdict = judge(payload, DOMAIN.decode, DOMAIN.failing_field)
    assert verdict.code == code
    assert not verdict.valid
    assert verdict.reason().startswith(f"would be quarantined again as {code}")


def test_a_payload_the_domain_decodes_is_valid() -> None:
    verdict = judge(b"{}", lambda _: object(), lambda _: None)
    assert verdict.valid
    assert verdict.reason() == "valid"
    refused = judge(b"{}", lambda _: DecodeFailure(ErrorCode.INVALID_FIELD), lambda _: ("items.0.sku", "required"))
    assert refused.reason() == "would be quarantined again as INVALID_FIELD (field items.0.sku: required)"
