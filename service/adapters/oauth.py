"""OAuth 2 client credentials for Kafka's SASL/OAUTHBEARER (contract §11): aiokafka asks its token provider for a
token at each authentication; this one fetches it from the token URL (RFC 6749 §4.4, the client authenticated with
HTTP Basic, §2.3.1), keeps it, and fetches the next one before it expires, once for every client of the process.

A token endpoint that fails (unreachable, refusing, answering no token) raises `TokenUnavailable`: the client's
connection fails as in any outage, and the process waits it out (service/adapters/kafka.py, `start_with_backoff`).
Its message names what happened, never the client secret or a token.
"""

from __future__ import annotations

import asyncio
import base64
import time
import urllib.parse
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from aiokafka.abc import AbstractTokenProvider
from pydantic import SecretStr

from service.errors import TokenUnavailable

if TYPE_CHECKING:
    from service.config import Settings

# How long a token endpoint may take to answer.
_TIMEOUT = timedelta(seconds=10)
# A token is fetched again when this share of its lifetime is gone (or a minute before it expires, if sooner).
_REFRESH_AT = 0.8
_EARLY_SECONDS = 60.0
_DEFAULT_LIFETIME_SECONDS = 3600.0  # `expires_in` is optional (RFC 6749 §5.1)


class ClientCredentials(AbstractTokenProvider):  # type: ignore[misc]
    """A token of the client-credentials grant, kept until shortly before it expires."""

    def __init__(
        self,
        token_url: str,
        client_id: str,
        client_secret: SecretStr,
        scope: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._token_url = token_url
        self._client_id = client_id
        self._client_secret = client_secret
        self._scope = scope
        self._clock = clock
        self._token: str | None = None
        self._fresh_until = 0.0
        self._fetching: asyncio.Lock | None = None

    async def token(self) -> str:
        """A token that is not about to expire; fetched once for all the connections that ask at the same time."""
        if self._token is not None and self._clock() < self._fresh_until:
            return self._token
        if self._fetching is None:
            self._fetching = asyncio.Lock()
        async with self._fetching:
            if self._token is None or self._clock() >= self._fresh_until:
                self._token, lifetime = await self._fetch()
                self._fresh_until = self._clock() + min(lifetime * _REFRESH_AT, max(lifetime - _EARLY_SECONDS, 0))
        return self._token

    async def _fetch(self) -> tuple[str, float]:
        from service.adapters.http import HttpClient, TransportError

        # Each part form-encoded first (RFC 6749 §2.3.1): a `:` in the id, a `%` or `+` in the secret mean themselves.
        client_id = urllib.parse.quote_plus(self._client_id, safe="")
        secret = urllib.parse.quote_plus(self._client_secret.get_secret_value(), safe="")
        credentials = f"{client_id}:{secret}".encode()
        headers = {"Authorization": "Basic " + base64.b64encode(credentials).decode("ascii")}
        form = {"grant_type": "client_credentials"}
        if self._scope:
            form["scope"] = self._scope
        http = HttpClient.open(_TIMEOUT, connections=1)
        try:
            answer = await http.post_form(self._token_url, form=form, headers=headers)
        except TransportError as error:
            raise TokenUnavailable(f"the OAuth token endpoint cannot be reached ({type(error).__name__})") from None
        finally:
            await http.close()
        if answer.status_code != 200:
            raise TokenUnavailable(
                f"the OAuth token endpoint refused the client credentials (HTTP {answer.status_code})"
            )
        return _token_of(answer.content)


def _token_of(content: bytes) -> tuple[str, float]:
    """The access token and its lifetime in seconds from a token endpoint's answer (RFC 6749 §5.1)."""
    import orjson

    try:
        document: Any = orjson.loads(content)
    except ValueError:
        raise TokenUnavailable("the OAuth token endpoint answered no JSON") from None
    token = document.get("access_token") if isinstance(document, dict) else None
    if not isinstance(token, str) or not token:
        raise TokenUnavailable("the OAuth token endpoint answered no access_token")
    lifetime = document.get("expires_in")
    if isinstance(lifetime, str) and lifetime.isdigit():
        lifetime = int(lifetime)  # some issuers send it as a string ("3599")
    valid = isinstance(lifetime, int | float) and not isinstance(lifetime, bool) and lifetime > 0
    return token, float(lifetime) if valid else _DEFAULT_LIFETIME_SECONDS


_PROVIDERS: dict[tuple[str, str, str, str | None], ClientCredentials] = {}


def provider_for(settings: Settings) -> ClientCredentials:
    """The process's token provider for these settings: every Kafka client of the process shares its token."""
    url, client_id, secret = (
        settings.kafka_oauth_token_url,
        settings.kafka_oauth_client_id,
        settings.kafka_oauth_client_secret,
    )
    if url is None or client_id is None or secret is None:
        raise TokenUnavailable("OAUTHBEARER needs the token URL, the client id and the client secret")
    key = (url, client_id, secret.get_secret_value(), settings.kafka_oauth_scope)
    provider = _PROVIDERS.get(key)
    if provider is None:
        provider = _PROVIDERS[key] = ClientCredentials(url, client_id, secret, settings.kafka_oauth_scope)
    return provider
