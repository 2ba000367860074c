"""What a reprocess run is asked (`Selection`: which records, `Options`: how) and what it reports as it goes
(`Progress`) and at its end (`Report`); the run itself is service/worker/reprocess.py's."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Protocol


@dataclass(frozen=True)
class Selection:
    """Which quarantined records a run takes."""

    failure_ids: tuple[str, ...] = ()
    error_code: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    # (failure id, status) as an operator saw them in a dry run: a record found otherwise now is not sent.
    seen: tuple[tuple[str, str], ...] = ()
    owner: str | None = None  # only the records of this owner (the team a record's error code routes to)


@dataclass(frozen=True)
class Options:
    """How a run behaves."""

    reason: str
    actor: str
    rate: float = 10.0
    sample: int | None = None
    dry_run: bool = False
    max_failure_rate: float = 0.2
    max_lag: int = 10_000
    verify_timeout: float = 120.0
    ramp: bool = False  # batches of service/policy/ramp.py's schedule, each sent once the one before is verified


@dataclass
class Report:
    """What a run did; printed as JSON with --json and stored in `reprocess_runs.counts`."""

    run_id: str | None
    selected: int  # the records the selection matched: those it sends (`selection`) and the `undecodable`
    undecodable: list[str] = field(default_factory=list)
    erased: dict[str, str] = field(default_factory=dict)  # refused: their bytes were removed (when, by whom)
    published: int = 0
    reprocessed: int = 0
    failed_again: int = 0
    noop: int = 0
    unverified: int = 0
    skipped: int = 0  # not sent: resolved or otherwise changed since it was selected (`reprocess show` says how)
    outcome: str = "completed"
    stop_reason: str | None = None
    selection: list[str] = field(default_factory=list)  # the selected records it sends (not the undecodable ones)
    statuses: dict[str, str] = field(default_factory=dict)  # each selected record's status when it was selected

    def counts(self) -> dict[str, Any]:
        """The numbers for the audit row."""
        return {key: value for key, value in asdict(self).items() if key not in {"selection", "run_id", "statuses"}}


class Progress(Protocol):
    """Where a run reports progress: a rich bar on a terminal, plain lines otherwise, a console page."""

    def opened(self, run_id: str) -> None:
        """The run's audit row exists (before anything is sent)."""

    def start(self, stage: str, total: int) -> None:
        """A stage begins."""

    def advance(self, published: int, verified: int) -> None:
        """Counts moved."""

    def finish(self) -> None:
        """The stage ended."""
