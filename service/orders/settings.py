"""The order domain's settings, on top of the core's (service/config.py): its downstreams and its tenants."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import field_validator
from pydantic_settings import NoDecode

from service.config import BaseUrl, Settings


class OrderSettings(Settings):
    """The core's settings and the order domain's, each read from `ORDERS_<FIELD>`."""

    customers_url: BaseUrl = None
    payments_url: BaseUrl = None
    emails_url: BaseUrl = None
    known_tenants: Annotated[tuple[str, ...], NoDecode] = ("acme", "globex", "initech")

    @field_validator("known_tenants", mode="before")
    @classmethod
    def _split_tenants(cls, value: Any) -> Any:
        if isinstance(value, str):
            tenants = tuple(part.strip() for part in value.split(",") if part.strip())
            if not tenants:
                raise ValueError("needs at least one tenant id, comma-separated")
            return tenants
        return value


# The domain's variables each command reads besides the core's (service/cli/environment.py `READS`).
READS: dict[str, tuple[str, ...]] = {
    "consume": ("customers_url", "known_tenants"),
    "run": ("customers_url", "known_tenants", "payments_url", "emails_url"),
    "effects": ("payments_url", "emails_url"),
    "reconcile": ("payments_url", "emails_url"),
    "effects list": ("payments_url", "emails_url"),
}
