"""Where and how every database connection of the service connects: one value for the engine, migrations, the CLI
and the console alike.

`ORDERS_DATABASE_URL` is a SQLAlchemy URL (`postgresql+asyncpg://…`) whose query may carry libpq's TLS parameters,
as every managed PostgreSQL documents them: `sslmode` (`disable`, `allow`, `prefer`, `require`, `verify-ca`,
`verify-full`), `sslrootcert`, `sslcert`, `sslkey`. asyncpg takes none of them as keywords (SQLAlchemy hands a URL's
query to the driver as keywords), so they become the `ssl` argument asyncpg does take: a context that verifies as
libpq's mode says. `ORDERS_DATABASE_PASSWORD` replaces a password in the URL. The URL is shown only with its
password as `***` (`Database.shown`).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL, make_url

SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_TLS_PARAMETERS = ("sslmode", "sslrootcert", "sslcert", "sslkey")


class DatabaseUrlError(ValueError):
    """A database URL that cannot be connected with; its message names the parameter, never the password."""


@dataclass(frozen=True)
class Database:
    """A database to connect to: the URL (its password included) and asyncpg's `ssl` argument (None: asyncpg's own
    default, which is libpq's `prefer`)."""

    url: URL
    ssl: ssl.SSLContext | str | bool | None = None

    @property
    def shown(self) -> str:
        """The URL as it may be shown: its password as `***`."""
        return self.url.render_as_string(hide_password=True)

    def connect_args(self) -> dict[str, Any]:
        """The driver's keyword arguments for TLS."""
        return {} if self.ssl is None else {"ssl": self.ssl}


def database(url: str, password: str | None = None) -> Database:
    """The database `url` names, with its libpq TLS parameters turned into asyncpg's `ssl` and `password` (when
    given) in place of one in the URL; DatabaseUrlError when a TLS parameter cannot be used."""
    parsed = make_url(url)
    query = dict(parsed.query)
    tls = {name: _one(query.pop(name)) for name in _TLS_PARAMETERS if name in query}
    parsed = parsed.set(query=query)
    if password is not None:
        parsed = parsed.set(password=password)
    return Database(parsed, _ssl_argument(tls))


def _one(value: str | tuple[str, ...]) -> str:
    if isinstance(value, tuple):
        if len(value) != 1:
            raise DatabaseUrlError("a TLS parameter is given more than once")
        return value[0]
    return value


def _ssl_argument(tls: dict[str, str]) -> ssl.SSLContext | str | bool | None:
    """asyncpg's `ssl` for libpq's parameters (https://www.postgresql.org/docs/15/libpq-ssl.html): `disable` none,
    `allow` and `prefer` asyncpg's own modes (TLS when the server offers it, unverified), `require` TLS unverified
    (verified as `verify-ca` when a root certificate is given, as libpq does), `verify-ca` the server's certificate
    signed by the root certificates, `verify-full` that and its host name; a client certificate with `sslcert` and
    `sslkey`. Without `sslrootcert`, the system's CAs are the root certificates."""
    if not tls:
        return None
    mode = tls.get("sslmode", "prefer")
    if mode not in SSL_MODES:
        raise DatabaseUrlError(f"sslmode={mode} is not one of {', '.join(SSL_MODES)}")
    for name in ("sslrootcert", "sslcert", "sslkey"):
        if name in tls and not Path(tls[name]).is_file():
            raise DatabaseUrlError(f"{name}: no readable file at {tls[name]}")
    if ("sslcert" in tls) != ("sslkey" in tls):
        raise DatabaseUrlError("sslcert and sslkey go together (the client certificate and its key)")
    if mode == "disable":
        return False
    if mode in ("allow", "prefer") and "sslcert" not in tls:
        return mode
    if mode == "require" and "sslrootcert" in tls:
        mode = "verify-ca"
    if mode == "verify-ca" and "sslrootcert" not in tls:
        # libpq refuses it too: checked against the system's CAs without the host name, any publicly trusted
        # certificate (one for any domain at all) would pass.
        raise DatabaseUrlError("sslmode=verify-ca needs sslrootcert (the CA that signs the server's certificate)")
    try:
        context = ssl.create_default_context(cafile=tls.get("sslrootcert"))
    except (ssl.SSLError, OSError) as error:
        raise DatabaseUrlError(f"sslrootcert: not a PEM file of certificates ({type(error).__name__})") from None
    if mode in ("allow", "prefer", "require"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif mode == "verify-ca":
        context.check_hostname = False
    if "sslcert" in tls:
        try:
            context.load_cert_chain(tls["sslcert"], tls["sslkey"], password=_no_passphrase)
        except (ssl.SSLError, OSError, ValueError) as error:
            raise DatabaseUrlError(f"sslcert/sslkey: not a certificate and its key ({type(error).__name__})") from None
    return context


def _no_passphrase() -> str:
    """An encrypted key: refused in one line, instead of OpenSSL asking for its passphrase on the terminal."""
    raise ValueError("an encrypted key (give sslkey without a passphrase)")
