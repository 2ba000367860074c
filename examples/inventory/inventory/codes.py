"""The inventory domain's registered codes (`service.ports.DomainCode`): its business rejections and
the refused outcomes of its effects. All are terminal, never retried."""

from __future__ import annotations

from service.ports import DomainCode


class InventoryCode(DomainCode):
    """A permanent business answer of the inventory domain."""

    UNKNOWN_SKU = "UNKNOWN_SKU"  # the catalogue does not know the SKU
    INSUFFICIENT_STOCK = "INSUFFICIENT_STOCK"  # the warehouse has fewer than the reservation asks for
    RESERVATION_NOT_FOUND = "RESERVATION_NOT_FOUND"  # a release of a reservation never made
    RESERVATION_EXISTS = "RESERVATION_EXISTS"  # a second reserve of one reservation
    ALREADY_RELEASED = "ALREADY_RELEASED"  # a second release
    HOLD_REFUSED = "HOLD_REFUSED"  # the warehouse refused the hold (422: the stock went meanwhile)
    NOTHING_HELD = "NOTHING_HELD"  # a release the warehouse has no hold for (404)
