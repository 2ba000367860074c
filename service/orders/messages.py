"""Source record schemas (contract §5), one pydantic model per `schema` value."""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
)
from typing_extensions import TypedDict

from service.ports import AggregateId, DecodeFailure, ErrorCode

NonEmpty = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
Currency = Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")]
# What the store's columns hold: `orders.sequence` and `amount_cents` are bigint; text cannot hold NUL.
BIGINT_MAX = 2**63 - 1
# Up to this many lines, no total can pass BIGINT_MAX (each line is at most 10^6 x 10^12 cents): only a longer
# order is summed when it is decoded.
_LINES_THAT_FIT = BIGINT_MAX // (1_000_000 * 10**12)
Sequence = Annotated[int, Field(ge=1, le=BIGINT_MAX)]


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", strict=False)

    order_id: AggregateId

    @property
    def aggregate_id(self) -> str:
        """The order the message is about: the core's aggregate id."""
        return self.order_id


# A typed dict, not a model: a model per line made every record's validation dearer (docs/performance.md,
# "What the consumer does per record"). The rules read the lines and never change them.
class Item(TypedDict):
    """One order line; unknown keys are ignored."""

    sku: NonEmpty
    quantity: Annotated[int, Field(gt=0, le=1_000_000)]
    unit_price_cents: Annotated[int, Field(ge=0, le=10**12)]


class OrderPlacedV1(_Message):
    """`order.placed.v1`: creates the order."""

    schema_name: Literal["order.placed.v1"] = Field(alias="schema")
    tenant: NonEmpty
    customer_id: NonEmpty
    currency: Currency
    items: list[Item] = Field(min_length=1, max_length=10_000)

    @property
    def amount_cents(self) -> int:
        """The order total."""
        total = 0  # a loop, not sum() over a generator: it runs once per record (docs/performance.md)
        for item in self.items:
            total += item["quantity"] * item["unit_price_cents"]
        return total


class OrderPlacedV2(OrderPlacedV1):
    """`order.placed.v2`: v1 plus `placed_at` and an optional `sequence`."""

    schema_name: Literal["order.placed.v2"] = Field(alias="schema")  # type: ignore[assignment]
    placed_at: AwareDatetime
    sequence: Sequence | None = None


class OrderShippedV1(_Message):
    """`order.shipped.v1`: moves a placed order to shipped."""

    schema_name: Literal["order.shipped.v1"] = Field(alias="schema")
    carrier: NonEmpty
    tracking_number: NonEmpty
    sequence: Sequence | None = None


class OrderCancelledV1(_Message):
    """`order.cancelled.v1`: moves a placed order to cancelled."""

    schema_name: Literal["order.cancelled.v1"] = Field(alias="schema")
    reason: NonEmpty
    sequence: Sequence | None = None


OrderMessage = OrderPlacedV1 | OrderPlacedV2 | OrderShippedV1 | OrderCancelledV1

SCHEMAS: dict[str, type[_Message]] = {
    "order.placed.v1": OrderPlacedV1,
    "order.placed.v2": OrderPlacedV2,
    "order.shipped.v1": OrderShippedV1,
    "order.cancelled.v1": OrderCancelledV1,
}


# A field discriminator, read by pydantic-core straight from the JSON: a callable one made it build the whole
# document as Python objects first (about 40 % slower per record).
_ANY_MESSAGE: TypeAdapter[OrderMessage] = TypeAdapter(
    Annotated[OrderPlacedV1 | OrderPlacedV2 | OrderShippedV1 | OrderCancelledV1, Field(discriminator="schema_name")]
)


def decode(value: bytes | None) -> OrderMessage | DecodeFailure:
    """Decode and validate one record value; never raises for bad input."""
    if value is not None:
        try:
            # The common case in one pass (parse and validate in pydantic-core); failures are sorted out below.
            # Straight to the adapter's validator, without `TypeAdapter.validate_json`'s own layer
            # (docs/performance.md, "What the consumer does per record").
            message: OrderMessage = _ANY_MESSAGE.validator.validate_json(value, strict=True)
        except (ValidationError, RecursionError):
            pass
        else:
            if not _fits(message, value):
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
    model = SCHEMAS.get(schema_name)
    if model is None:
        # Keep an unknown schema name out of envelopes unless it looks like one of ours: it is producer text.
        return DecodeFailure(code=ErrorCode.SCHEMA_UNSUPPORTED, schema_name=_safe_schema_name(schema_name))
    try:
        # Strict JSON validation: `"quantity": "2"` or `true` is an ill-typed field, not a number.
        validated = model.model_validate_json(value, strict=True)  # type: ignore[arg-type]
    except ValidationError:
        return DecodeFailure(code=ErrorCode.INVALID_FIELD, schema_name=schema_name)
    assert isinstance(validated, OrderPlacedV1 | OrderShippedV1 | OrderCancelledV1)
    if not _fits(validated, value):  # type: ignore[arg-type]
        return DecodeFailure(code=ErrorCode.INVALID_FIELD, schema_name=schema_name)
    return validated


def _fits(message: OrderMessage, value: bytes) -> bool:
    """Whether the store's columns can hold the message: no NUL in any text, a total within bigint."""
    # JSON can spell NUL only as the escape \u0000, so only a value holding that text needs the walk (an int
    # needle: a plain memchr; docs/performance.md).
    if _BACKSLASH in value and b"\\u0000" in value and _holds_nul(message.model_dump()):
        return False
    if type(message) in PLACEMENTS and len(message.items) > _LINES_THAT_FIT:  # type: ignore[union-attr]
        return message.amount_cents <= BIGINT_MAX  # type: ignore[union-attr]
    return True


def _holds_nul(value: Any) -> bool:
    """Whether a text anywhere in a validated message holds NUL, which no text column can store."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(item) for item in value.values())
    if isinstance(value, list):
        return any(_holds_nul(item) for item in value)
    return False


_SCHEMA_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*$")


def _safe_schema_name(name: str) -> str | None:
    """Keep a schema name only when it is shaped like one (`order.teleported.v9`): it is producer text."""
    return name if len(name) <= 64 and _SCHEMA_NAME.fullmatch(name) else None


def sequence_of(message: OrderMessage) -> int | None:
    """The producer's per-order sequence, when the schema has one (placed v1 has none)."""
    # An exact type look-up, not isinstance (pydantic models answer it through ABCMeta) or getattr (a missing
    # attribute goes through BaseModel.__getattr__): both are slow on the hot path.
    if type(message) in _SEQUENCED:
        return message.sequence  # type: ignore[union-attr]
    return None


def placed_at(message: OrderMessage) -> datetime | None:
    """When the producer says the order was placed, if it says so."""
    return message.placed_at if type(message) is OrderPlacedV2 else None


_SEQUENCED = frozenset({OrderPlacedV2, OrderShippedV1, OrderCancelledV1})
PLACEMENTS = frozenset({OrderPlacedV1, OrderPlacedV2})
_BACKSLASH = ord("\\")


_FIELD_PART = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def invalid_field(value: bytes | None) -> tuple[str, str] | None:
    """For a value that decodes as `INVALID_FIELD`: the path of the first failing field (`items.0.quantity`) and
    the rule it breaks (pydantic's error type, e.g. `int_type`, `missing`, `less_than_equal`), for an operator.
    Names only, never values; a part of the path that is not shaped like a field name shows as `?`. None when
    the value is not an invalid-field case."""
    if not isinstance(decode(value), DecodeFailure) or value is None:
        return None
    try:
        document = json.loads(value)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(document, dict):
        return None
    schema_name = document.get("schema")
    if not isinstance(schema_name, str):
        return ("schema", "missing" if "schema" not in document else "string_type")
    model = SCHEMAS.get(schema_name)
    if model is None:
        return None
    try:
        model.model_validate_json(value, strict=True)
    except ValidationError as error:
        first = error.errors()[0]
        path = ".".join(str(part) if _FIELD_PART.fullmatch(str(part)) else "?" for part in first["loc"])
        return (path or "(document)", str(first["type"]))
    return ("(a text field or the total)", "holds NUL or is beyond what its column holds")
