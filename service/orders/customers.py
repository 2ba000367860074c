"""Customer directory client (contract §6): `GET {CUSTOMERS}/customers/{id}`."""

from __future__ import annotations

from typing import Any

from service.orders.model import CustomerStatus
from service.ports import Answer, Downstream, api_error, lookup_failure, path_segment

_STATUSES = {"active": CustomerStatus.ACTIVE, "blocked": CustomerStatus.BLOCKED}


def _own(answer: Answer, body: Any) -> bool:
    """The directory's own answers: a customer (`{"id", "status": "active"|"blocked"}`), or a 404 with its JSON
    `error` (an unknown customer). Anything else (an HTML 404 of a wrong path, a redirect, 401, `[]`) is not."""
    if answer.status_code == 404:
        return api_error(body)
    if answer.status_code != 200 or not isinstance(body, dict):
        return False
    status = body.get("status")
    return isinstance(body.get("id"), str) and isinstance(status, str) and status in _STATUSES


class CustomersClient(Downstream):
    """Asks the customer directory whether a customer may place orders; with `ORDERS_CUSTOMERS_URL` unset,
    every customer counts as active."""

    downstream = "customers"

    async def status(self, customer_id: str) -> CustomerStatus:
        """The customer's status; raises DownstreamError when the directory did not answer as itself (an outage,
        a misconfiguration, its breaker open)."""
        if self._base_url is None:
            return CustomerStatus.ACTIVE
        exchange = await self._get(f"/customers/{path_segment(customer_id)}", _own)
        answer = exchange.own
        if answer is None:
            raise lookup_failure(exchange, self.downstream) from exchange.error
        if answer.status_code == 404:
            return CustomerStatus.UNKNOWN
        return _STATUSES[exchange.body["status"]]
