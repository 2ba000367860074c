"""The order domain's fake customer, payment and email APIs, put on the generic fault-injection server.

Integration tests and the demo start `Downstream` (in-process, or as a separate process with
`python -m service.orders.fakes`) and point order-service at its URL. The routes, their fault injection,
latency and `/_control/*` come from `service/testing/faults.py`; this module only says what the three APIs
answer and keep. Calls are counted by the customer id for customers.get, the idempotency key for payments.*,
and the ref for emails.*.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, get_args

from service.ports import (
    FakeApi,
    FaultServer,
    Reply,
    Request,
    Route,
    json_field,
    json_reply,
    key_from_body,
    key_from_header,
    key_from_param,
    key_from_query,
    serve_from_command_line,
)

CUSTOMERS_GET: Final = "customers.get"
PAYMENTS_POST: Final = "payments.post"
PAYMENTS_GET: Final = "payments.get"
EMAILS_POST: Final = "emails.post"
EMAILS_GET: Final = "emails.get"
ROUTES: Final = (CUSTOMERS_GET, PAYMENTS_POST, PAYMENTS_GET, EMAILS_POST, EMAILS_GET)

CustomerStatus = Literal["active", "blocked"]
PaymentKind = Literal["capture", "refund"]


def _default_customer_status(customer_id: str) -> CustomerStatus | None:
    """Status of a customer nobody registered: the prefix decides, so tests need no setup for common cases."""
    if customer_id.startswith("blocked-"):
        return "blocked"
    if customer_id.startswith("missing-"):
        return None
    return "active"


def _customer_status(value: object) -> CustomerStatus | None:
    """Validate a customer status coming from JSON."""
    if value == "active":
        return "active"
    if value == "blocked":
        return "blocked"
    if value is None:
        return None
    raise ValueError(f"status must be 'active', 'blocked' or null, got {value!r}")


def _payment_problem(payload: dict[str, Any]) -> str | None:
    """Describe what is wrong with a payment body, or None when it is valid."""
    for name in ("order_id", "currency"):
        if not isinstance(payload.get(name), str) or not payload[name]:
            return f"{name} must be a non-empty string"
    amount = payload.get("amount_cents")
    if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
        return "amount_cents must be a non-negative integer"
    if payload.get("kind") not in get_args(PaymentKind):
        return f"kind must be one of {', '.join(get_args(PaymentKind))}"
    return None


class OrderFakes:
    """What the fake customer, payment and email APIs keep, and how they answer; mount `api()` on a server."""

    def __init__(self) -> None:
        """Start with no registered customers, declines, payments or emails."""
        # One lock for all state: handlers run on the server's thread, tests read and arrange from theirs.
        self._lock = threading.Lock()
        self._customers: dict[str, CustomerStatus | None] = {}
        self._declined_orders: set[str] = set()
        self._payments: dict[str, dict[str, Any]] = {}
        self._emails: list[dict[str, Any]] = []
        # Id sequences survive reset() so an id seen before a reset can never name a different record after.
        self._payment_seq = 0
        self._email_seq = 0

    def api(self) -> FakeApi:
        """The routes, controls, state and reset the fault-injection server serves for these APIs."""
        return FakeApi(
            routes=(
                Route(CUSTOMERS_GET, "GET", "/customers/{id}", self._get_customer, key_from_param("id")),
                Route(PAYMENTS_POST, "POST", "/payments", self._post_payment, key_from_header("Idempotency-Key")),
                Route(PAYMENTS_GET, "GET", "/payments", self._get_payment, key_from_query("idempotency_key")),
                Route(EMAILS_POST, "POST", "/emails", self._post_email, key_from_body("ref")),
                Route(EMAILS_GET, "GET", "/emails", self._list_emails, key_from_query("ref")),
            ),
            controls={"customers": self._control_customer, "declines": self._control_decline},
            snapshot=self.snapshot,
            reset=self.reset,
        )

    def set_customer(self, customer_id: str, status: CustomerStatus | None) -> None:
        """Register a customer as "active", "blocked" or unknown (None: 404), overriding the default rule."""
        if status not in (*get_args(CustomerStatus), None):
            raise ValueError(f"customer status must be 'active', 'blocked' or None, got {status!r}")
        with self._lock:
            self._customers[customer_id] = status

    def decline_order(self, order_id: str, declined: bool = True) -> None:
        """Make every new payment for this order answer 402 card_declined (declined=False: accept them again)."""
        with self._lock:
            if declined:
                self._declined_orders.add(order_id)
            else:
                self._declined_orders.discard(order_id)

    def reset(self) -> None:
        """Forget payments, emails, registered customers and declines."""
        with self._lock:
            self._customers.clear()
            self._declined_orders.clear()
            self._payments.clear()
            self._emails.clear()

    def payments(self) -> dict[str, dict[str, Any]]:
        """Snapshot of the stored payments by idempotency key."""
        with self._lock:
            return copy.deepcopy(self._payments)

    def emails(self, ref: str | None = None) -> list[dict[str, Any]]:
        """Snapshot of the stored emails in arrival order, optionally only those with one ref."""
        with self._lock:
            return [dict(email) for email in self._emails if ref is None or email["ref"] == ref]

    def snapshot(self) -> Mapping[str, object]:
        """The payments and emails, as `GET /_control/state` shows them."""
        with self._lock:
            return {"payments": copy.deepcopy(self._payments), "emails": [dict(email) for email in self._emails]}

    def _get_customer(self, request: Request) -> Reply:
        """GET /customers/{id}."""
        customer_id = request.params["id"]
        with self._lock:
            if customer_id in self._customers:
                status = self._customers[customer_id]
            else:
                status = _default_customer_status(customer_id)
        if status is None:
            return json_reply(404, {"error": "not found"})
        return json_reply(200, {"id": customer_id, "status": status})

    def _post_payment(self, request: Request) -> Reply:
        """POST /payments: idempotent on the Idempotency-Key header, like real payment providers."""
        key, payload = request.header("Idempotency-Key"), request.payload
        if not key:
            return json_reply(400, {"error": "missing Idempotency-Key header"})
        if payload is None:
            return json_reply(400, {"error": "body must be a JSON object"})
        problem = _payment_problem(payload)
        if problem is not None:
            return json_reply(400, {"error": problem})
        with self._lock:
            stored = self._payments.get(key)
            if stored is not None:
                # A replay answers what the first call answered, even if the order was declined since.
                return json_reply(200, {"payment_id": stored["payment_id"], "status": stored["status"]})
            if payload["order_id"] in self._declined_orders:
                return json_reply(402, {"error": "card_declined"})
            self._payment_seq += 1
            payment = {
                "payment_id": f"pay_{self._payment_seq}",
                "status": "succeeded",
                "order_id": payload["order_id"],
                "amount_cents": payload["amount_cents"],
                "currency": payload["currency"],
                "kind": payload["kind"],
                "idempotency_key": key,
            }
            self._payments[key] = payment
        return json_reply(201, {"payment_id": payment["payment_id"], "status": payment["status"]})

    def _get_payment(self, request: Request) -> Reply:
        """GET /payments?idempotency_key=K."""
        key = request.query.get("idempotency_key")
        if key is None:
            return json_reply(400, {"error": "missing idempotency_key query parameter"})
        with self._lock:
            stored = self._payments.get(key)
            payment = None if stored is None else dict(stored)
        if payment is None:
            return json_reply(404, {"error": "not found"})
        return json_reply(200, payment)

    def _post_email(self, request: Request) -> Reply:
        """POST /emails: deliberately NOT idempotent, so duplicate sends are visible to tests."""
        payload = request.payload
        if payload is None:
            return json_reply(400, {"error": "body must be a JSON object"})
        for name in ("to_customer", "template", "ref"):
            if not isinstance(payload.get(name), str):
                return json_reply(400, {"error": f"{name} must be a string"})
        with self._lock:
            self._email_seq += 1
            email = {
                "email_id": f"em_{self._email_seq}",
                "to_customer": payload["to_customer"],
                "template": payload["template"],
                "ref": payload["ref"],
            }
            self._emails.append(email)
        return json_reply(202, {"email_id": email["email_id"]})

    def _list_emails(self, request: Request) -> Reply:
        """GET /emails?ref=R (every email without `ref`)."""
        return json_reply(200, self.emails(request.query.get("ref")))

    def _control_customer(self, payload: dict[str, Any]) -> None:
        """`POST /_control/customers` with `{"id": ..., "status": "active" | "blocked" | null}`."""
        self.set_customer(json_field(payload, "id", str), _customer_status(payload.get("status")))

    def _control_decline(self, payload: dict[str, Any]) -> None:
        """`POST /_control/declines` with `{"order_id": ...}`."""
        self.decline_order(json_field(payload, "order_id", str))


class Downstream(FaultServer):
    """The fake customer, payment and email APIs alone on a fault-injection server, as tests and the demo use."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Configure the address; nothing listens until start()."""
        self._fakes = OrderFakes()
        super().__init__(host, port, apis=(self._fakes.api(),))

    def set_customer(self, customer_id: str, status: CustomerStatus | None) -> None:
        """Register a customer as "active", "blocked" or unknown (None: 404), overriding the default rule."""
        self._fakes.set_customer(customer_id, status)

    def decline_order(self, order_id: str, declined: bool = True) -> None:
        """Make every new payment for this order answer 402 card_declined (declined=False: accept them again)."""
        self._fakes.decline_order(order_id, declined)

    def payments(self) -> dict[str, dict[str, Any]]:
        """Snapshot of the stored payments by idempotency key."""
        return self._fakes.payments()

    def emails(self, ref: str | None = None) -> list[dict[str, Any]]:
        """Snapshot of the stored emails in arrival order, optionally only those with one ref."""
        return self._fakes.emails(ref)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the fake APIs until SIGTERM or SIGINT, after printing the base URL as the only stdout line."""
    return serve_from_command_line(
        Downstream,
        prog="python -m service.orders.fakes",
        description="Fake customer, payment and email APIs with fault injection (see /_control/*).",
        argv=argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
