"""Which database errors mean "wait and retry" (no record attempt spent): decided by SQLSTATE as well as by class."""

from __future__ import annotations

import pytest
from sqlalchemy import exc

from service.store.uow import is_unavailable


class DriverError(Exception):
    """A driver exception as asyncpg raises it: its SQLSTATE in `sqlstate`."""

    def __init__(self, sqlstate: str) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


def wrapped(sqlstate: str) -> exc.DBAPIError:
    """The driver error as SQLAlchemy hands it on: a plain DBAPIError (not OperationalError) with `orig`."""
    return exc.DBAPIError("SELECT 1", {}, DriverError(sqlstate))


@pytest.mark.parametrize(
    "sqlstate",
    ["57P01", "57P02", "57P03", "53300", "08000", "08003", "08006"],
    ids=["admin-shutdown", "crash-shutdown", "cannot-connect-now", "too-many-connections", "08000", "08003", "08006"],
)
def test_a_server_going_away_or_refusing_connections_is_unavailable(sqlstate: str) -> None:
    assert is_unavailable(wrapped(sqlstate))
    assert is_unavailable(DriverError(sqlstate))


@pytest.mark.parametrize("sqlstate", ["23505", "22P05", "42P01", "40001", "22003"])
def test_a_statement_or_content_error_is_not_unavailable(sqlstate: str) -> None:
    assert not is_unavailable(wrapped(sqlstate))


def test_a_refused_socket_is_unavailable() -> None:
    assert is_unavailable(ConnectionRefusedError())


def test_a_pool_that_hands_out_no_connection_in_time_is_unavailable() -> None:
    # (SQLAlchemy's QueuePool raises this when every connection stays checked out past `pool_timeout`)
    assert is_unavailable(exc.TimeoutError("QueuePool limit of size 5 overflow 10 reached, connection timed out"))
