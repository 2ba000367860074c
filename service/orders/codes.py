"""The order domain's registered codes (service/codes.py `DomainCode`): its business rejections and the
refused outcomes of its effects. All are terminal, never retried."""

from __future__ import annotations

from service.ports import DomainCode


class OrderCode(DomainCode):
    """A permanent business answer of the order domain."""

    UNKNOWN_TENANT = "UNKNOWN_TENANT"
    ORDER_NOT_FOUND = "ORDER_NOT_FOUND"
    ORDER_EXISTS = "ORDER_EXISTS"
    INVALID_TRANSITION = "INVALID_TRANSITION"
    UNKNOWN_CUSTOMER = "UNKNOWN_CUSTOMER"
    CUSTOMER_BLOCKED = "CUSTOMER_BLOCKED"
    PAYMENT_DECLINED = "PAYMENT_DECLINED"  # the provider declined a capture (402)
    CAPTURE_FAILED = "CAPTURE_FAILED"  # a refund with no capture to refund
