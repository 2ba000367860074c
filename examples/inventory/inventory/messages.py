"""The inventory domain's source record schemas, one pydantic model per `schema` value.

`stock.reserved.v1` reserves a quantity of one SKU at one warehouse; `stock.released.v1` releases it. The
record's key is the reservation id, the core's aggregate id.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError

from service.ports import AggregateId, DecodeFailure, ErrorCode

NonEmpty = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
# What the store's columns hold: `quantity` and `sequence` are bigint; text cannot hold NUL.
BIGINT_MAX = 2**63 - 1
Sequence = Annotated[int, Field(ge=1, le=BIGINT_MAX)]


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", strict=False)

    reservation_id: AggregateId

    @property
    def aggregate_id(self) -> str:
        """The reservation the message is about: the core's aggregate id."""
        return self.reservation_id


class StockReservedV1(_Message):
    """`stock.reserved.v1`: creates the reservation (its sequence is 1)."""

    schema_name: Literal["stock.reserved.v1"] = Field(alias="schema")
    sku: NonEmpty
    quantity: int = Field(gt=0, le=1_000_000)
    warehouse: NonEmpty


class StockReleasedV1(_Message):
    """`stock.released.v1`: releases a reservation."""

    schema_name: Literal["stock.released.v1"] = Field(alias="schema")
    reason: NonEmpty
    sequence: Sequence | None = None


InventoryMessage = StockReservedV1 | StockReleasedV1

SCHEMAS: dict[str, type[_Message]] = {
    "stock.reserved.v1": StockReservedV1,
    "stock.released.v1": StockReleasedV1,
}

_ANY_MESSAGE: TypeAdapter[InventoryMessage] = TypeAdapter(
    Annotated[StockReservedV1 | StockReleasedV1, Field(discriminator="schema_name")]
)


def decode(value: bytes | None) -> InventoryMessage | DecodeFailure:
    """Decode and validate one record value; never raises for bad input."""
    if value is not None:
        try:
            # Strict JSON validation: `"quantity": "2"` or `true` is an ill-typed field, not a number.
            message = _ANY_MESSAGE.validate_json(value, strict=True)
        except (ValidationError, RecursionError):
            pass
        else:
            # JSON spells NUL only as the escape \u0000: only a value holding that text needs the walk.
            if b"\\u0000" in value and _holds_nul(message.model_dump()):
                return DecodeFailure(code=ErrorCode.INVALID_FIELD, schema_name=message.schema_name)
            return message
    try:
        document: Any = json.loads(value) if value is not None else None
    except (UnicodeDecodeError, ValueError, RecursionError):
        return DecodeFailure(code=ErrorCode.MALFORMED_PAYLOAD)
    if not isinstance(document, dict):
        return DecodeFailure(code=ErrorCode.MALFORMED_PAYLOAD)
    schema_name = document.get("schema")
    if not isinstance(schema_name, str):
        return DecodeFailure(code=ErrorCode.INVALID_FIELD)
    if schema_name not in SCHEMAS:
        # Keep an unknown schema name out of envelopes unless it looks like one: it is producer text.
        return DecodeFailure(code=ErrorCode.SCHEMA_UNSUPPORTED, schema_name=_safe_schema_name(schema_name))
    # A known schema that failed the one-pass validation above: a missing, ill-typed or NUL-holding field.
    return DecodeFailure(code=ErrorCode.INVALID_FIELD, schema_name=schema_name)


def _holds_nul(value: Any) -> bool:
    """Whether a text anywhere in a validated message holds NUL, which no text column can store."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(item) for item in value.values())
    return False


_SCHEMA_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*$")
_FIELD_PART = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _safe_schema_name(name: str) -> str | None:
    """Keep a schema name only when it is shaped like one (`stock.moved.v9`): it is producer text."""
    return name if len(name) <= 64 and _SCHEMA_NAME.fullmatch(name) else None


def sequence_of(message: InventoryMessage) -> int | None:
    """The producer's per-reservation sequence, when the message has one (a reserve is 1)."""
    return message.sequence if isinstance(message, StockReleasedV1) else 1


def invalid_field(value: bytes | None) -> tuple[str, str] | None:
    """For a value that decodes as `INVALID_FIELD`: the path of the first failing field and the rule it breaks
    (pydantic's error type), for an operator. Names only, never values. None when it is not such a case."""
    failure = decode(value)
    if not isinstance(failure, DecodeFailure) or failure.code is not ErrorCode.INVALID_FIELD or value is None:
        return None
    document = json.loads(value)
    schema_name = document.get("schema")
    if not isinstance(schema_name, str):
        return ("schema", "missing" if "schema" not in document else "string_type")
    try:
        SCHEMAS[schema_name].model_validate_json(value, strict=True)
    except ValidationError as error:
        first = error.errors()[0]
        path = ".".join(str(part) if _FIELD_PART.fullmatch(str(part)) else "?" for part in first["loc"])
        return (path or "(document)", str(first["type"]))
    return ("(a text field)", "holds NUL, which no text column holds")
