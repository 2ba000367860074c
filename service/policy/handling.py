"""The values a domain's handler and the core's processor exchange (service/ports.py `Handler`): what a record's
bytes could not become, what the core reads of an applied message and of an aggregate, and a permanent business
rejection. Pure values, no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from service.codes import Code, ErrorCode


@dataclass(frozen=True, slots=True)  # not a pydantic model: isinstance on those goes through ABCMeta, slowly
class DecodeFailure:
    """Why a record's bytes cannot become a message; `schema_name` is kept when it was readable."""

    code: ErrorCode
    schema_name: str | None = None


@dataclass(frozen=True)
class Rejected:
    """The message is a permanent business rejection: terminal, never retried, announced by an event; its code is
    usually one the domain registers (service/codes.py `DomainCode`)."""

    code: Code


class Aggregate(Protocol):
    """What the core reads of a domain's aggregate: its id, its version (its events carry it) and the sequence
    of the last message applied to it (`versioned` ordering)."""

    @property
    def aggregate_id(self) -> str:
        """The aggregate's id (the key of its row, and of its events)."""

    @property
    def version(self) -> int:
        """1 when created, one more with every change."""

    @property
    def sequence(self) -> int | None:
        """The applied message's sequence, when its schema has one."""


class Applied(Protocol):
    """What a domain's rule returns for a message it applied: the aggregate's new state, and the effects and
    events the change causes (the round writes them in its one transaction)."""

    @property
    def aggregate(self) -> Aggregate:
        """The aggregate after the change."""

    @property
    def effects(self) -> Sequence[Any]:
        """The external calls to make later (`idempotency_key`, `kind`, `payload`)."""

    @property
    def events(self) -> Sequence[Any]:
        """The domain events to publish (Handler.event makes their documents)."""
