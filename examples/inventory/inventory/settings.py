"""The inventory domain's settings, on top of the core's: its two downstreams, each read from `INVENTORY_<FIELD>`."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from service.ports import BaseUrl, Settings, check_credentials

PROGRAM = "inventory-service"  # the console script, the distribution, the default consumer name
ENV_PREFIX = "INVENTORY_"  # every setting is this prefix and its name in capitals: INVENTORY_DATABASE_URL
DOWNSTREAMS = ("stock", "warehouse")


class InventorySettings(Settings):
    """The core's settings and the inventory domain's. Unset, `stock_url` means a reserve is not checked against
    the stock before it is applied (the warehouse's hold is then the only check), and `warehouse_url` means the
    holds and releases wait, pending."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX)
    program: ClassVar[str] = PROGRAM

    database_url: SecretStr = SecretStr("postgresql+asyncpg://postgres@127.0.0.1:55432/inventory")
    consumer_name: str = Field(default=PROGRAM, min_length=1, max_length=200)
    source_topic: str = Field(default="inventory", pattern=r"^[A-Za-z0-9._-]{1,200}$")

    stock_url: BaseUrl = None
    warehouse_url: BaseUrl = None
    # Each downstream's credentials: a bearer token (a secret), its CA, a client certificate and key.
    stock_token: SecretStr | None = None
    stock_ca_file: str | None = None
    stock_cert_file: str | None = None
    stock_key_file: str | None = None
    warehouse_token: SecretStr | None = None
    warehouse_ca_file: str | None = None
    warehouse_cert_file: str | None = None
    warehouse_key_file: str | None = None

    @model_validator(mode="after")
    def _check_credentials(self) -> InventorySettings:
        check_credentials(self, DOWNSTREAMS)
        return self


# The domain's variables each command reads besides the core's (each command's --help lists them).
READS: dict[str, tuple[str, ...]] = {
    "consume": ("stock_url",),
    "run": ("stock_url", "warehouse_url"),
    "effects": ("warehouse_url",),
    "reconcile": ("warehouse_url",),
    "effects list": ("warehouse_url",),
}
