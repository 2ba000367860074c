"""The OAuth client-credentials provider against a real token endpoint (an aiohttp server on loopback): how it
authenticates the client (RFC 6749 §2.3.1)."""

from __future__ import annotations

import base64
import urllib.parse

from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from service.adapters.oauth import ClientCredentials

_PRINTABLE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x2FF), min_size=1, max_size=40)


@settings(max_examples=8, deadline=None, print_blob=True)
@given(client_id=_PRINTABLE, secret=_PRINTABLE)
@example(client_id="tenant:service one", secret="s%2Bcr+t:é")
async def test_the_client_id_and_secret_reach_the_endpoint_form_encoded_inside_basic(
    client_id: str, secret: str
) -> None:
    # Given a token endpoint that decodes HTTP Basic as the RFC says (each part form-decoded after the split)
    seen: list[tuple[str, str]] = []

    async def token(request: web.Request) -> web.Response:
        scheme, _, encoded = request.headers.get("Authorization", "").partition(" ")
        assert scheme == "Basic"
        raw_id, _, raw_secret = base64.b64decode(encoded).decode("ascii").partition(":")
        seen.append((urllib.parse.unquote_plus(raw_id), urllib.parse.unquote_plus(raw_secret)))
        return web.json_response({"access_token": "t", "expires_in": 300, "token_type": "Bearer"})

    app = web.Application()
    app.router.add_post("/token", token)
    async with TestServer(app, host="127.0.0.1") as server:
        # When a provider whose id and secret hold `:`, `%`, `+`, spaces or any letter asks for a token
        provider = ClientCredentials(str(server.make_url("/token")), client_id, SecretStr(secret))
        answer = await provider.token()

    # Then the endpoint read exactly that id and secret (a `:` in the id does not move the split)
    assert (answer, seen) == ("t", [(client_id, secret)])
