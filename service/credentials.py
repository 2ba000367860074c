"""The settings' checks that credentials go together: Kafka's security settings (contract §11), and a domain's
downstream credentials (contract §6)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol

from pydantic import SecretStr

from service import addresses


class Named(Protocol):
    """Settings that name their environment variables (service/config.py's `Settings` and a domain's subclass)."""

    def variable(self, name: str) -> str:
        """The environment variable of a setting, or of a group of them."""
        ...


class KafkaSecurity(Named, Protocol):
    """The Kafka security settings `check_kafka_security` reads (service/config.py's `Settings` has them)."""

    @property
    def kafka_security_protocol(self) -> str:
        """PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."""
        ...

    @property
    def kafka_sasl_mechanism(self) -> str:
        """PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER."""
        ...

    @property
    def kafka_sasl_username(self) -> str | None:
        """The PLAIN or SCRAM login."""
        ...

    @property
    def kafka_sasl_password(self) -> SecretStr | None:
        """The PLAIN or SCRAM password."""
        ...

    @property
    def kafka_oauth_token_url(self) -> str | None:
        """Where OAUTHBEARER's tokens come from."""
        ...

    @property
    def kafka_oauth_client_id(self) -> str | None:
        """OAUTHBEARER's client."""
        ...

    @property
    def kafka_oauth_client_secret(self) -> SecretStr | None:
        """OAUTHBEARER's client's secret."""
        ...

    @property
    def kafka_ssl_cafile(self) -> str | None:
        """The CA that signs the brokers' certificates."""
        ...

    @property
    def kafka_ssl_certfile(self) -> str | None:
        """The client certificate."""
        ...

    @property
    def kafka_ssl_keyfile(self) -> str | None:
        """The client certificate's key."""
        ...


def check_credentials(settings: Named, downstreams: tuple[str, ...]) -> None:
    """A domain's downstream credentials (contract §6: `<downstream>_token`, `_ca_file`, `_cert_file`, `_key_file`)
    go together: a client certificate needs its key, every file named is readable, and a CA or a certificate needs an
    https:// URL; a token goes over http only to a loopback address (a local sidecar), never in clear on a network."""
    p = settings.variable("")
    for name in downstreams:
        ca, cert, key = (getattr(settings, f"{name}_{what}", None) for what in ("ca_file", "cert_file", "key_file"))
        variable = f"{p}{name.upper()}"
        if (cert is None) != (key is None):
            raise ValueError(f"{variable}_CERT_FILE and {variable}_KEY_FILE: the client certificate needs its key")
        for what, value in (("CA_FILE", ca), ("CERT_FILE", cert), ("KEY_FILE", key)):
            if value is not None and not Path(value).is_file():
                raise ValueError(f"{variable}_{what}: no readable file at {value}")
        url = getattr(settings, f"{name}_url", None)
        if (ca or cert) and url is not None and not url.startswith("https://"):
            raise ValueError(f"{variable}_CA_FILE / _CERT_FILE: need an https:// {variable}_URL")
        token = getattr(settings, f"{name}_token", None)
        if token is not None and url is not None and not url.startswith("https://") and not addresses.loopback(url):
            raise ValueError(
                f"{variable}_TOKEN: needs an https:// {variable}_URL (http:// only to a loopback address: "
                "the token would travel in clear)"
            )


_KAFKA_TLS = ("SSL", "SASL_SSL")
_KAFKA_SASL = ("SASL_PLAINTEXT", "SASL_SSL")


def check_kafka_security(settings: KafkaSecurity) -> None:
    """The Kafka security settings go together: what a protocol and mechanism need is set, what they cannot use is
    not, and every file named is readable (a mistake here would only show as a client that never connects)."""
    p = settings.variable("")
    protocol, mechanism = settings.kafka_security_protocol, settings.kafka_sasl_mechanism
    protocol_is = f"with {p}KAFKA_SECURITY_PROTOCOL={protocol}"
    files = {
        "KAFKA_SSL_CAFILE": settings.kafka_ssl_cafile,
        "KAFKA_SSL_CERTFILE": settings.kafka_ssl_certfile,
        "KAFKA_SSL_KEYFILE": settings.kafka_ssl_keyfile,
    }
    if protocol not in _KAFKA_TLS:
        given = [name for name, value in files.items() if value]
        if given:
            raise ValueError(f"{p}{given[0]}: has no use {protocol_is}; use SSL or SASL_SSL")
    if (settings.kafka_ssl_certfile is None) != (settings.kafka_ssl_keyfile is None):
        raise ValueError(f"{p}KAFKA_SSL_CERTFILE and {p}KAFKA_SSL_KEYFILE: the client certificate needs its key")
    for name, value in files.items():
        if value and not Path(value).is_file():
            raise ValueError(f"{p}{name}: no readable file at {value}")
    if protocol not in _KAFKA_SASL:
        return
    if mechanism == "OAUTHBEARER":
        missing = [
            name
            for name, value in (
                ("KAFKA_OAUTH_TOKEN_URL", settings.kafka_oauth_token_url),
                ("KAFKA_OAUTH_CLIENT_ID", settings.kafka_oauth_client_id),
                ("KAFKA_OAUTH_CLIENT_SECRET", settings.kafka_oauth_client_secret),
            )
            if not value
        ]
        if missing:
            raise ValueError(f"{p}{missing[0]}: needed with {p}KAFKA_SASL_MECHANISM=OAUTHBEARER")
        token_url = settings.kafka_oauth_token_url or ""
        if not token_url.startswith(("https://", "http://")):
            raise ValueError(f"{p}KAFKA_OAUTH_TOKEN_URL: must be an https:// (or http://) URL")
        if token_url.startswith("http://") and not addresses.loopback(token_url):
            raise ValueError(
                f"{p}KAFKA_OAUTH_TOKEN_URL: must be https:// (http:// only to a loopback address: the client secret "
                "would travel in clear)"
            )
        authority = re.split(r"[/?#]", token_url.partition("://")[2], maxsplit=1)[0]
        try:
            addresses.check_address(authority, "allowed: an http(s) URL with a host", port_required=False)
        except ValueError as error:
            raise ValueError(f"{p}KAFKA_OAUTH_TOKEN_URL: {error}") from None
    elif not settings.kafka_sasl_username or settings.kafka_sasl_password is None:
        name = "KAFKA_SASL_USERNAME" if not settings.kafka_sasl_username else "KAFKA_SASL_PASSWORD"
        raise ValueError(f"{p}{name}: needed with {p}KAFKA_SASL_MECHANISM={mechanism}")
