"""The unit of work: one PostgreSQL transaction whose exit rolls back unless `commit()` was called.

Driver errors that mean "the database is not there" are translated here, at one boundary, into
InfrastructureUnavailable so callers wait and retry instead of spending a record's attempts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import TracebackType

from sqlalchemy import exc, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncTransaction, create_async_engine

from service.errors import ConcurrentWrite, InfrastructureUnavailable
from service.store import connect
from service.store.connect import Database

# SQLSTATEs that say the server is going away or not taking connections, whatever class the driver maps them to:
# class 08 (connection exception), admin and crash shutdown, "cannot connect now" (starting up or shutting
# down) and too many connections. Matching classes alone let `CannotConnectNowError` through.
_UNAVAILABLE_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})

_PING = text("SELECT 1")


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a driver error, or of the driver error a SQLAlchemy error wraps."""
    state = getattr(getattr(error, "orig", None), "sqlstate", None) or getattr(error, "sqlstate", None)
    return state if isinstance(state, str) else None


# SQLSTATE classes of a statement that may well succeed when run again: transaction rollback (40: deadlock,
# serialization), object not in prerequisite state (55: lock not available), operator intervention (57:
# statement timeout, cancel), insufficient resources (53) and system errors (58).
_PASSING_CLASSES = frozenset({"40", "53", "55", "57", "58"})


def is_passing(error: BaseException) -> bool:
    """True for a database error that says nothing about the content written (a retry may well succeed)."""
    state = sqlstate(error)
    return state is not None and state[:2] in _PASSING_CLASSES


def is_conflict(error: BaseException) -> bool:
    """True for a deadlock or a serialization failure: the transaction lost a race and can be redone at once."""
    state = sqlstate(error)
    return state is not None and state.startswith("40")


def is_unavailable(error: BaseException) -> bool:
    """True for errors that say the database cannot be reached, not that a statement is wrong."""
    if isinstance(error, exc.DBAPIError) and error.connection_invalidated:
        return True
    state = sqlstate(error)
    if state is not None and (state.startswith("08") or state in _UNAVAILABLE_STATES):
        return True
    # A pool that handed out no connection within its timeout: every connection of the process is busy on a
    # database too slow to give them back. Waiting is the answer, not spending the records' attempts.
    return isinstance(
        error, exc.OperationalError | exc.InterfaceError | exc.DisconnectionError | exc.TimeoutError | OSError
    )


@asynccontextmanager
async def translated_errors() -> AsyncIterator[None]:
    """Re-raise connection-level failures as InfrastructureUnavailable, keeping the cause."""
    try:
        yield
    except Exception as error:
        if is_unavailable(error):
            raise InfrastructureUnavailable("database unavailable") from error
        if is_conflict(error):
            raise ConcurrentWrite("deadlock or serialization failure") from error
        raise


class UnitOfWork:
    """One transaction on its own connection; `async with UnitOfWork(engine) as uow: ...; await uow.commit()`."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._connection: AsyncConnection | None = None
        self._transaction: AsyncTransaction | None = None
        self._committed = False

    @property
    def connection(self) -> AsyncConnection:
        """The connection of this transaction."""
        assert self._connection is not None, "use UnitOfWork inside `async with`"
        return self._connection

    async def __aenter__(self) -> UnitOfWork:
        async with translated_errors():
            self._connection = await self._engine.connect()
            self._transaction = await self._connection.begin()
        return self

    async def commit(self) -> None:
        """Commit; without this call the transaction is rolled back on exit."""
        assert self._transaction is not None
        async with translated_errors():
            await self._transaction.commit()
        self._committed = True

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            if self._transaction is not None and not self._committed and self._transaction.is_active:
                await self._transaction.rollback()
        except Exception:
            pass
        finally:
            if self._connection is not None:
                await self._connection.close()
        if exc_value is not None and is_unavailable(exc_value):
            raise InfrastructureUnavailable("database unavailable") from exc_value
        if exc_value is not None and is_conflict(exc_value):
            raise ConcurrentWrite("deadlock or serialization failure") from exc_value


@asynccontextmanager
async def one_statement(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection for one statement outside an explicit transaction (autocommit: the statement is its own
    transaction and its own snapshot): no BEGIN and no COMMIT or ROLLBACK around it, two round trips fewer
    than a UnitOfWork. For one statement only: two would not be atomic."""
    async with translated_errors(), engine.connect() as connection:
        await connection.execution_options(isolation_level="AUTOCOMMIT")
        yield connection


def create_engine(database: Database | str, *, pool_size: int = 5) -> AsyncEngine:
    """The engine every process uses, on `database` (service/store/connect.py: its TLS, its password).

    No `pool_pre_ping`: it costs three round trips per checkout (BEGIN, a ping, ROLLBACK), a large part of a
    small round at a steady rate (docs/performance.md). A connection the database dropped fails once instead, as
    InfrastructureUnavailable (the caller waits and tries again), and SQLAlchemy then discards every pooled
    connection older than that failure, so a restarted database still costs one failed round, not one per
    pooled connection (tests/integration/test_restarts.py). `force_custom_plan`: the hot
    statements take arrays of ids; a generic plan cached while the tables were still empty would scan them
    whole for as long as the connection lives (seconds per round once they have grown).
    """
    if isinstance(database, str):
        database = connect.database(database)
    return create_async_engine(
        database.url,
        pool_size=pool_size,
        # Up to three times the pool at a peak: `run` shares one engine between the consumer's rounds, the relay's
        # batches in flight (five), the effect lanes and the listening sessions.
        max_overflow=2 * pool_size,
        pool_recycle=1800,
        connect_args={"server_settings": {"plan_cache_mode": "force_custom_plan"}, **database.connect_args()},
    )


async def ping(engine: AsyncEngine) -> None:
    """Run a trivial query on a connection of the pool: PostgreSQL answers, or the driver's error is raised."""
    async with engine.connect() as connection:
        await connection.execute(_PING)
