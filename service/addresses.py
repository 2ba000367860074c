"""Addresses in the settings: host names, ports, `host:port` servers, base URLs, the console's trace link and the
database URL, each checked for what the clients could connect to, with a message naming the accepted form (pure: no
I/O)."""

from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

_VISIBLE_ASCII = re.compile(r"[!-~]+", re.ASCII)
_LABEL = re.compile(r"[A-Za-z0-9_-]{1,63}", re.ASCII)  # a DNS label; `_` for names such as Docker services'
_PORT = re.compile(r"[0-9]{1,5}", re.ASCII)
_BASE_URL_FORM = (
    "allowed: an http:// or https:// base URL, http(s)://host[:port][/path] with a port from 1 to 65535, "
    "without user:password@, query or fragment; or empty to disable the call"
)
TRACE_PLACEHOLDER = "{trace_id}"  # where a trace link setting takes a record's trace id
_SAMPLE_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"  # W3C Trace Context's example: what fills the placeholder
_TRACE_URL_FORM = (
    f"allowed: an http:// or https:// URL holding {TRACE_PLACEHOLDER} once, e.g. "
    f"http://jaeger.internal:16686/trace/{TRACE_PLACEHOLDER}, visible ASCII, any other brace percent-encoded (%7B, "
    "%7D), without user:password@; or empty for no link"
)
DATABASE_URL_FORM = (
    "allowed: postgresql+asyncpg://user[:password]@host[:port]/database[?options], a port from 1 to 65535, "
    "special characters of the user and password percent-encoded, libpq's sslmode (disable, allow, prefer, require, "
    "verify-ca, verify-full), sslrootcert, sslcert and sslkey naming readable files"
)
_OTLP_FORM = (
    "allowed: the collector's OTLP/HTTP URL, http(s)://host[:port][/path] with a port from 1 to 65535, e.g. "
    "http://collector:4318, without user:password@ (credentials go in OTEL_EXPORTER_OTLP_HEADERS)"
)
_BOOTSTRAP_FORM = "allowed: comma-separated host:port, a port from 1 to 65535, an IPv6 address in brackets ([::1]:9092)"


def _host(host: str) -> bool:
    """Whether `host` is an IP address or a DNS name (letters, digits, `-` and `_` between dots; a trailing dot).
    Digits and dots alone that are no IPv4 address (`10.0.0.256`) are a typo, not a name."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        labels = host.removesuffix(".").split(".")
        return (
            len(host) <= 253
            and all(_LABEL.fullmatch(label) for label in labels)
            and not all(label.isdigit() for label in labels)
        )
    return True


def _port(text: str) -> bool:
    """Whether `text` is a TCP port a client can connect to: digits, 1 to 65535."""
    return _PORT.fullmatch(text) is not None and 1 <= int(text) <= 65535


def check_address(authority: str, form: str, *, port_required: bool) -> None:
    """Refuse a `host[:port]` (an IPv6 host in brackets) that cannot be connected to, in a message ending with
    `form`."""
    if authority.startswith("["):
        host, closed, after = authority[1:].partition("]")
        if not closed or ":" not in host or not _host(host) or after[:1] not in ("", ":"):
            raise ValueError(f"brackets must hold an IPv6 address, [::1]; {form}")
        has_port, port = after.startswith(":"), after[1:]
    elif authority.count(":") > 1:
        raise ValueError(f"an IPv6 address must be written in brackets, [::1]; {form}")
    else:
        host, colon, port = authority.partition(":")
        has_port = bool(colon)
        if not _host(host):
            raise ValueError(f"the host must be a host name or an IP address; {form}")
    if port_required and not has_port:
        raise ValueError(f"every server needs its port; {form}")
    if has_port and not _port(port):
        raise ValueError(f"the port must be a number from 1 to 65535; {form}")


def _check_http_url(url: str, form: str, *, query: bool) -> None:
    """Refuse an http(s) URL that cannot be followed, or that holds credentials, in a message ending with `form`:
    another scheme, no host, a port out of range, user:password@; a query or a fragment too unless `query`."""
    if not _VISIBLE_ASCII.fullmatch(url):
        raise ValueError(f"must be visible ASCII (percent-encoded, a non-ASCII host name in punycode); {form}")
    scheme, separator, rest = url.partition("://")
    if scheme.lower() not in ("http", "https") or not separator:
        raise ValueError(f"must start with http:// or https://; {form}")
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if "@" in authority:
        raise ValueError(f"must not hold credentials (user@ or user:password@); {form}")
    if not query and ("?" in rest or "#" in rest):
        raise ValueError(f"must not have a query or a fragment; {form}")
    check_address(authority, form, port_required=False)


def _check_base_url(url: str) -> None:
    """Refuse a base URL the HTTP client could not call (service/adapters/http.py): another scheme, no host, a port
    out of range, credentials (contract §6 gives a downstream settings of its own for them); and a query or a
    fragment, which the calls' own paths and parameters would be appended to."""
    _check_http_url(url, _BASE_URL_FORM, query=False)


def check_database_url(url: str) -> None:
    """Refuse a database URL SQLAlchemy cannot read or that names no reachable port; a password is allowed."""
    if not url.startswith("postgresql+asyncpg://"):
        raise ValueError(f"must be a SQLAlchemy URL starting with postgresql+asyncpg://; {DATABASE_URL_FORM}")
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise ValueError(f"is not a URL SQLAlchemy can read; {DATABASE_URL_FORM}") from None
    # A URL without a host is libpq's default (a Unix socket, or `?host=`), without a port the default port.
    if parsed.host is not None and not _host(parsed.host):
        raise ValueError(f"the host must be a host name or an IP address; {DATABASE_URL_FORM}")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise ValueError(f"the port must be a number from 1 to 65535; {DATABASE_URL_FORM}")


def bootstrap_servers(value: str) -> str:
    """The Kafka bootstrap servers, each `host:port`, without the blanks around them; ValueError when there are none
    or one cannot be connected to (an empty list would leave the client waiting for ever)."""
    servers = [server.strip() for server in value.split(",") if server.strip()]
    if not servers:
        raise ValueError(f"needs at least one server; {_BOOTSTRAP_FORM}")
    for server in servers:
        if "://" in server:
            raise ValueError(f"a server is host:port, without a scheme or listener name; {_BOOTSTRAP_FORM}")
        check_address(server, _BOOTSTRAP_FORM, port_required=True)
    return ",".join(servers)


def base_url(value: Any) -> Any:
    """A downstream's base URL setting: blank is unset (the calls are off), else an http(s) URL the HTTP client can
    call, without a trailing /.

    For a domain's URL settings: `Annotated[str | None, BeforeValidator(base_url)]`."""
    if isinstance(value, str):
        value = value.strip().rstrip("/")
        if not value:
            return None
        _check_base_url(value)
    return value


def trace_url(value: Any) -> Any:
    """The console's trace link setting: blank is no link, else an http(s) URL holding `{trace_id}` exactly once and
    no other brace (a second placeholder would never be filled), where the console puts a record's trace id.

    The URL is checked with a trace id in the placeholder's place, as the console's links will be."""
    if isinstance(value, str):
        value = value.strip()
        if not value:
            return ""
        if value.count(TRACE_PLACEHOLDER) != 1:
            raise ValueError(f"must hold {TRACE_PLACEHOLDER} exactly once; {_TRACE_URL_FORM}")
        if re.search(r"[{}]", value.replace(TRACE_PLACEHOLDER, "")):
            raise ValueError(f"must hold no placeholder or brace but {TRACE_PLACEHOLDER}; {_TRACE_URL_FORM}")
        _check_http_url(value.replace(TRACE_PLACEHOLDER, _SAMPLE_TRACE_ID), _TRACE_URL_FORM, query=True)
    return value


# The OpenTelemetry SDK's endpoint variables (its own names: no prefix), the traces' own first.
OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def check_otlp_endpoint(url: str) -> None:
    """Refuse an OTLP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`, read by the OpenTelemetry SDK, not by the settings)
    that the exporter could not post to: a typo would otherwise start a service whose spans all fail to export."""
    _check_http_url(url.strip(), _OTLP_FORM, query=True)


def loopback(url: str) -> bool:
    """Whether an http(s) URL's host is this machine (localhost, 127.0.0.0/8, ::1)."""
    host = (urlsplit(url).hostname or "").rstrip(".")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
