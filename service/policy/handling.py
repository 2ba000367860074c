"""The values a domain's handler and the core's processor exchange (service/worker/handler.py): what a record's
bytes could not become, and a permanent business rejection. Pure values, no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from service.domain.codes import Code, ErrorCode


@dataclass(frozen=True, slots=True)  # not a pydantic model: isinstance on those goes through ABCMeta, slowly
class DecodeFailure:
    """Why a record's bytes cannot become a message; `schema_name` is kept when it was readable."""

    code: ErrorCode
    schema_name: str | None = None


@dataclass(frozen=True)
class Rejected:
    """The message is a permanent business rejection: terminal, never retried, announced by an event; its code is
    usually one the domain registers (service/domain/codes.py `DomainCode`)."""

    code: Code
