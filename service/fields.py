"""Field types a domain's message schemas share."""

from __future__ import annotations

from typing import Annotated

from pydantic import StringConstraints

# An aggregate id becomes a Kafka key, an idempotency key (an HTTP header) and a path segment downstream: no
# control character (Unicode's Cc: C0, DEL, C1), which a header cannot carry. A message whose id holds one is
# refused at the door as INVALID_FIELD rather than accepted with an effect that could never be sent.
AggregateId = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f-\x9f]+$")
]
