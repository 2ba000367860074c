"""The order domain's fake customer, payment and email APIs answer the documented contract.

The generic server under them (faults, latency, keep-alive, control) has its own tests in
`tests/integration/test_fault_server.py`; here faults appear only where they meet a fake's state.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.orders.fakes import ROUTES, Downstream, OrderFakes
from service.testing.faults import FakeApi, FaultServer, Route, json_reply, key_from_param
from tests.support import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]


def payment_body(order_id: str = "o-1", kind: str = "capture") -> dict[str, Any]:
    """A valid payment request body."""
    return {"order_id": order_id, "amount_cents": 1250, "currency": "EUR", "kind": kind}


def email_body(ref: str = "o-1:confirmation") -> dict[str, Any]:
    """A valid email request body."""
    return {"to_customer": "c-1", "template": "order_confirmed", "ref": ref}


@pytest.fixture
def downstream() -> Iterator[Downstream]:
    """A started server, stopped after the test."""
    with Downstream() as server:
        yield server


@pytest.fixture
def client(downstream: Downstream) -> Iterator[httpx.Client]:
    """A keep-alive client on the server; trust_env=False so a proxy in the environment cannot interfere."""
    with httpx.Client(base_url=downstream.url, timeout=2.0, trust_env=False) as http:
        yield http


def short_timeout_client(downstream: Downstream) -> httpx.Client:
    """A client that gives up after 0.2 s, like a service with a tight deadline."""
    return httpx.Client(base_url=downstream.url, timeout=0.2, trust_env=False)


def pay(client: httpx.Client, key: str, order_id: str = "o-1") -> httpx.Response:
    """POST a payment with an idempotency key."""
    return client.post("/payments", json=payment_body(order_id), headers={"Idempotency-Key": key})


# -- lifecycle ---------------------------------------------------------------------------------------------


def test_start_returns_the_base_url_and_stop_closes_the_port() -> None:
    server = Downstream()
    url = server.start()
    assert url == server.url
    assert url.startswith("http://127.0.0.1:")
    with httpx.Client(trust_env=False) as http:
        assert http.get(f"{url}/customers/c-1").status_code == 200
        server.stop()
        server.stop()  # a second stop is harmless
        with pytest.raises(httpx.ConnectError):
            http.get(f"{url}/customers/c-1")
    with pytest.raises(RuntimeError):
        _ = server.url


def test_the_fakes_serve_the_routes_the_service_calls() -> None:
    assert Downstream().routes == ROUTES


def test_the_order_fakes_can_share_one_server_with_another_domains_api() -> None:
    fakes = OrderFakes()
    stock = FakeApi(
        routes=[Route("stock.get", "GET", "/stock/{sku}", lambda r: json_reply(200, r.params), key_from_param("sku"))],
        snapshot=lambda: {"stock": []},
    )
    with FaultServer(apis=[fakes.api(), stock]) as server, httpx.Client(base_url=server.url, trust_env=False) as http:
        server.fail_next("stock.get")
        assert http.get("/stock/S-1").status_code == 503
        assert http.get("/stock/S-1").json() == {"sku": "S-1"}
        assert pay(http, "k-1").status_code == 201
        state = http.get("/_control/state").json()
    assert list(fakes.payments()) == ["k-1"]
    assert (state["calls"]["stock.get"], state["calls"]["payments.post"]) == ({"S-1": 2}, {"k-1": 1})
    assert (state["stock"], list(state["payments"])) == ([], ["k-1"])


# -- customers ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("customer_id", "expected_status"),
    [("c-1", "active"), ("blocked-7", "blocked")],
)
def test_unregistered_customers_follow_the_default_rule(
    client: httpx.Client, customer_id: str, expected_status: str
) -> None:
    response = client.get(f"/customers/{customer_id}")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"id": customer_id, "status": expected_status}


def test_a_missing_prefixed_customer_is_not_found(client: httpx.Client) -> None:
    response = client.get("/customers/missing-3")
    assert response.status_code == 404
    assert response.json() == {"error": "not found"}


def test_registered_customers_override_the_default_rule(downstream: Downstream, client: httpx.Client) -> None:
    downstream.set_customer("blocked-1", "active")
    downstream.set_customer("c-2", "blocked")
    downstream.set_customer("c-3", None)
    assert client.get("/customers/blocked-1").json() == {"id": "blocked-1", "status": "active"}
    assert client.get("/customers/c-2").json() == {"id": "c-2", "status": "blocked"}
    assert client.get("/customers/c-3").status_code == 404


def test_an_invalid_customer_status_is_rejected(downstream: Downstream) -> None:
    with pytest.raises(ValueError, match="status"):
        downstream.set_customer("c-1", "gone")  # type: ignore[arg-type]


# -- payments ----------------------------------------------------------------------------------------------


def test_a_first_payment_is_created_and_stored(downstream: Downstream, client: httpx.Client) -> None:
    response = pay(client, "k-1")
    assert response.status_code == 201
    assert response.json() == {"payment_id": "pay_1", "status": "succeeded"}
    assert downstream.payments() == {
        "k-1": {
            "payment_id": "pay_1",
            "status": "succeeded",
            "order_id": "o-1",
            "amount_cents": 1250,
            "currency": "EUR",
            "kind": "capture",
            "idempotency_key": "k-1",
        }
    }


def test_a_repeated_idempotency_key_returns_the_same_payment(downstream: Downstream, client: httpx.Client) -> None:
    first = pay(client, "k-1")
    again = pay(client, "k-1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert list(downstream.payments()) == ["k-1"]
    assert downstream.calls("payments.post", "k-1") == 2


def test_distinct_idempotency_keys_create_distinct_payments(downstream: Downstream, client: httpx.Client) -> None:
    ids = {pay(client, "k-1").json()["payment_id"], pay(client, "k-2").json()["payment_id"]}
    assert ids == {"pay_1", "pay_2"}
    assert set(downstream.payments()) == {"k-1", "k-2"}


def test_a_payment_without_idempotency_key_is_rejected_and_not_stored(
    downstream: Downstream, client: httpx.Client
) -> None:
    response = client.post("/payments", json=payment_body())
    assert response.status_code == 400
    assert downstream.payments() == {}
    assert downstream.calls("payments.post") == 1


@pytest.mark.parametrize(
    "body",
    [
        {"order_id": "o-1", "amount_cents": "12", "currency": "EUR", "kind": "capture"},
        {"order_id": "o-1", "amount_cents": 12, "currency": "EUR", "kind": "chargeback"},
        {"amount_cents": 12, "currency": "EUR", "kind": "capture"},
        ["not", "an", "object"],
    ],
)
def test_an_invalid_payment_body_is_rejected_and_not_stored(
    downstream: Downstream, client: httpx.Client, body: object
) -> None:
    response = client.post("/payments", json=body, headers={"Idempotency-Key": "k-1"})
    assert response.status_code == 400
    assert downstream.payments() == {}


def test_a_declined_order_answers_402_and_stores_nothing(downstream: Downstream, client: httpx.Client) -> None:
    downstream.decline_order("o-9")
    response = pay(client, "k-1", order_id="o-9")
    assert response.status_code == 402
    assert response.json() == {"error": "card_declined"}
    assert downstream.payments() == {}
    assert pay(client, "k-2", order_id="o-10").status_code == 201


def test_a_stored_payment_can_be_looked_up_by_idempotency_key(client: httpx.Client) -> None:
    pay(client, "k-1")
    response = client.get("/payments", params={"idempotency_key": "k-1"})
    assert response.status_code == 200
    assert response.json()["payment_id"] == "pay_1"
    assert response.json()["idempotency_key"] == "k-1"
    assert response.json()["order_id"] == "o-1"


def test_looking_up_an_unknown_idempotency_key_is_not_found(client: httpx.Client) -> None:
    response = client.get("/payments", params={"idempotency_key": "nope"})
    assert response.status_code == 404


def test_concurrent_posts_with_one_key_store_exactly_one_payment(downstream: Downstream, client: httpx.Client) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = sorted(pool.map(lambda _: pay(client, "k-1").status_code, range(24)))
    assert statuses == [200] * 23 + [201]
    assert list(downstream.payments()) == ["k-1"]
    assert downstream.calls("payments.post", "k-1") == 24


# -- emails ------------------------------------------------------------------------------------------------


def test_every_email_post_is_stored_even_with_a_repeated_ref(downstream: Downstream, client: httpx.Client) -> None:
    first = client.post("/emails", json=email_body("r-1"))
    second = client.post("/emails", json=email_body("r-1"))
    assert (first.status_code, second.status_code) == (202, 202)
    assert first.json() == {"email_id": "em_1"}
    assert second.json() == {"email_id": "em_2"}
    assert [email["email_id"] for email in downstream.emails("r-1")] == ["em_1", "em_2"]


def test_emails_are_listed_by_ref(client: httpx.Client) -> None:
    client.post("/emails", json=email_body("r-1"))
    client.post("/emails", json=email_body("r-2"))
    response = client.get("/emails", params={"ref": "r-2"})
    assert response.status_code == 200
    assert response.json() == [{"email_id": "em_2", "to_customer": "c-1", "template": "order_confirmed", "ref": "r-2"}]


def test_listing_emails_for_an_unknown_ref_is_an_empty_list(client: httpx.Client) -> None:
    response = client.get("/emails", params={"ref": "nothing"})
    assert response.status_code == 200
    assert response.json() == []


def test_an_invalid_email_body_is_rejected_and_not_stored(downstream: Downstream, client: httpx.Client) -> None:
    response = client.post("/emails", json={"to_customer": "c-1", "template": "t"})
    assert response.status_code == 400
    assert downstream.emails() == []


# -- fault injection ---------------------------------------------------------------------------------------


def test_fail_next_answers_the_injected_status_retry_after_and_body_without_side_effect(
    downstream: Downstream, client: httpx.Client
) -> None:
    secret_body = {"error": "Bearer abc.def", "card": "4111111111111111"}
    downstream.fail_next("payments.post", status=429, retry_after=2, body=secret_body)
    failed = pay(client, "k-1")
    assert failed.status_code == 429
    assert failed.headers["retry-after"] == "2"
    assert failed.json() == secret_body
    assert downstream.payments() == {}
    assert pay(client, "k-1").status_code == 201
    assert downstream.calls("payments.post", "k-1") == 2


def test_a_fault_for_an_unknown_route_is_rejected(downstream: Downstream) -> None:
    with pytest.raises(ValueError, match="unknown route"):
        downstream.fail_next("payment.post")
    with pytest.raises(ValueError, match="times"):
        downstream.delay_next("emails.post", times=0)


def test_a_delayed_payment_is_stored_although_the_client_times_out(downstream: Downstream) -> None:
    # A long delay costs nothing: stopping the server wakes the sleeping handler.
    downstream.delay_next("payments.post", seconds=5.0)
    with short_timeout_client(downstream) as http, pytest.raises(httpx.ReadTimeout):
        pay(http, "k-1")
    assert wait_until(lambda: "k-1" in downstream.payments())
    # The delayed handler is still sleeping, yet other requests are answered within the short timeout.
    with short_timeout_client(downstream) as http:
        assert http.get("/customers/c-1").status_code == 200
        retried = pay(http, "k-1")
    assert retried.status_code == 200
    assert retried.json() == {"payment_id": "pay_1", "status": "succeeded"}
    assert list(downstream.payments()) == ["k-1"]


def test_a_cut_after_apply_drops_the_connection_but_keeps_the_payment(
    downstream: Downstream, client: httpx.Client
) -> None:
    downstream.cut_next("payments.post", after_apply=True)
    with pytest.raises(httpx.TransportError):
        pay(client, "k-1")
    assert list(downstream.payments()) == ["k-1"]
    assert downstream.calls("payments.post", "k-1") == 1
    assert pay(client, "k-1").status_code == 200  # the retry finds the payment the cut call made


def test_a_cut_before_apply_drops_the_connection_and_stores_nothing(
    downstream: Downstream, client: httpx.Client
) -> None:
    downstream.cut_next("emails.post", after_apply=False)
    with pytest.raises(httpx.TransportError):
        client.post("/emails", json=email_body("r-1"))
    assert downstream.emails() == []
    assert downstream.calls("emails.post", "r-1") == 1
    assert client.post("/emails", json=email_body("r-1")).status_code == 202


# -- observation -------------------------------------------------------------------------------------------


def test_calls_are_counted_per_route_and_key_including_faulted_ones(
    downstream: Downstream, client: httpx.Client
) -> None:
    downstream.fail_next("customers.get")
    client.get("/customers/c-1")
    client.get("/customers/c-1")
    client.get("/customers/missing-1")
    client.get("/payments", params={"idempotency_key": "k-1"})
    client.post("/emails", json=email_body("r-1"))
    client.get("/emails", params={"ref": "r-1"})
    client.get("/nowhere")  # not a faked route: not counted anywhere
    assert downstream.calls("customers.get") == 3
    assert downstream.calls("customers.get", "c-1") == 2
    assert downstream.calls("customers.get", "missing-1") == 1
    assert downstream.calls("customers.get", "c-2") == 0
    assert downstream.calls("payments.get", "k-1") == 1
    assert downstream.calls("payments.post") == 0
    assert downstream.calls("emails.post", "r-1") == 1
    assert downstream.calls("emails.get", "r-1") == 1


def test_reset_clears_state_faults_and_counters_but_keeps_the_default_rule(
    downstream: Downstream, client: httpx.Client
) -> None:
    downstream.set_customer("c-1", "blocked")
    downstream.decline_order("o-2")
    pay(client, "k-1")
    client.post("/emails", json=email_body())
    downstream.fail_next("customers.get")
    downstream.reset()
    assert downstream.payments() == {}
    assert downstream.emails() == []
    assert downstream.calls("payments.post") == 0
    assert client.get("/customers/c-1").json() == {"id": "c-1", "status": "active"}
    assert client.get("/customers/blocked-1").json()["status"] == "blocked"
    assert pay(client, "k-2", order_id="o-2").status_code == 201


# -- control over HTTP -------------------------------------------------------------------------------------


def test_customers_and_declines_can_be_set_over_http(client: httpx.Client) -> None:
    assert client.post("/_control/customers", json={"id": "c-1", "status": "blocked"}).status_code == 200
    assert client.post("/_control/customers", json={"id": "c-2", "status": None}).status_code == 200
    assert client.post("/_control/declines", json={"order_id": "o-7"}).status_code == 200
    assert client.get("/customers/c-1").json()["status"] == "blocked"
    assert client.get("/customers/c-2").status_code == 404
    assert pay(client, "k-1", order_id="o-7").status_code == 402


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("customers", {"id": "c-1", "status": "gone"}),
        ("customers", {"status": "blocked"}),
        ("declines", {"order_id": 7}),
        ("declines", {}),
    ],
)
def test_an_invalid_customer_or_decline_over_http_is_rejected(
    downstream: Downstream, client: httpx.Client, path: str, body: dict[str, Any]
) -> None:
    assert client.post(f"/_control/{path}", json=body).status_code == 400
    assert client.get("/customers/c-1").json()["status"] == "active"


def test_the_state_endpoint_reports_calls_payments_and_emails(client: httpx.Client) -> None:
    pay(client, "k-1")
    pay(client, "k-1")
    client.post("/emails", json=email_body("r-1"))
    client.get("/customers/c-1")
    state = client.get("/_control/state").json()
    assert state["calls"]["payments.post"] == {"k-1": 2}
    assert state["calls"]["customers.get"] == {"c-1": 1}
    assert state["calls"]["emails.post"] == {"r-1": 1}
    assert state["calls"]["emails.get"] == {}
    assert state["payments"]["k-1"]["payment_id"] == "pay_1"
    assert [email["ref"] for email in state["emails"]] == ["r-1"]


def test_reset_over_http_clears_the_state(downstream: Downstream, client: httpx.Client) -> None:
    pay(client, "k-1")
    assert client.post("/_control/reset").status_code == 200
    assert downstream.payments() == {}
    assert downstream.calls("payments.post") == 0


# -- command line ------------------------------------------------------------------------------------------


def test_the_cli_prints_its_url_serves_and_exits_cleanly_on_sigterm() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "-m", "service.orders.fakes", "--host", "127.0.0.1", "--port", "0"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT) as process:
        try:
            assert process.stdout is not None
            ready, _, _ = select.select([process.stdout], [], [], 10.0)
            assert ready, "the CLI printed no URL within 10 s"
            url = process.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:")
            with httpx.Client(base_url=url, timeout=2.0, trust_env=False) as http:
                assert pay(http, "k-1").status_code == 201
                assert http.get("/_control/state").json()["calls"]["payments.post"] == {"k-1": 1}
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=5.0) == 0
            assert process.stdout.read() == ""  # the URL was the only output
        finally:
            if process.poll() is None:
                process.kill()
