"""Customer directory client (contract §6): `GET {CUSTOMERS}/customers/{id}`."""

from __future__ import annotations

from service.adapters.http import Downstream, TransportError, path_segment, transient_status, transport_failure
from service.domain.codes import ErrorCode
from service.errors import DownstreamError
from service.orders.model import CustomerStatus


class CustomersClient(Downstream):
    """Asks the customer directory whether a customer may place orders; with `ORDERS_CUSTOMERS_URL` unset,
    every customer counts as active."""

    downstream = "customers"

    async def status(self, customer_id: str) -> CustomerStatus:
        """The customer's status; raises DownstreamError for transient failures."""
        if self._base_url is None:
            return CustomerStatus.ACTIVE
        url = f"{self._base_url}/customers/{path_segment(customer_id)}"
        try:
            response = await self._http.get(url)
        except TransportError as error:
            raise transport_failure(error, self.downstream) from error
        if response.status_code == 404:
            return CustomerStatus.UNKNOWN
        failure = transient_status(response, self.downstream)
        if failure is not None:
            raise failure
        if response.status_code != 200:
            raise DownstreamError(ErrorCode.UNEXPECTED_ERROR, downstream=self.downstream)
        try:
            status = response.json().get("status")
        except ValueError:
            raise DownstreamError(ErrorCode.UNEXPECTED_ERROR, downstream=self.downstream) from None
        return CustomerStatus.BLOCKED if status == "blocked" else CustomerStatus.ACTIVE
