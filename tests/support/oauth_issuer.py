"""A small local OAuth 2 issuer for the secured test broker (scripts/kafka-local-secured): the client-credentials
grant only (RFC 6749 §4.4), clients authenticated with HTTP Basic (client_secret_basic, §2.3.1), RS256 JWT access
tokens (RFC 9068's claims: `iss`, `sub` = the client id, `aud`, `iat`, `exp`, `scope`, `jti`).

    python tests/support/oauth_issuer.py keys DIR
    python tests/support/oauth_issuer.py serve DIR --port PORT --issuer URL --audience AUDIENCE

`keys` makes DIR/signing-key.pem (RSA 2048) and DIR/jwks.json (its public key, `kid` its RFC 7638 thumbprint) when
they are missing; the broker reads the JWKS as a file, so it never depends on this server being up. `serve` answers
`POST /token` (form `grant_type=client_credentials[&scope=…]`) with `{"access_token", "token_type": "Bearer",
"expires_in", "scope"}` and `GET /jwks.json`. Clients come from DIR/clients.json, read at every request:
`{"<client id>": {"secret": "…", "lifetime_s": 3600}}`; a negative `lifetime_s` issues tokens that expired that many
seconds ago (`expires_in` 0), for tests of a refused token. A wrong or missing secret is 401 `invalid_client`.

Run by path, not as `tests.support.oauth_issuer`: importing the `tests.support` package would load the service.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import sys
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

KEY_FILE = "signing-key.pem"
JWKS_FILE = "jwks.json"
CLIENTS_FILE = "clients.json"
DEFAULT_SCOPE = "kafka"
MAX_BODY = 64 * 1024


def b64url(data: bytes) -> str:
    """Base64url without padding (RFC 7515 §2)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _int_bytes(value: int) -> bytes:
    return value.to_bytes((value.bit_length() + 7) // 8, "big")


def public_jwk(key: rsa.RSAPrivateKey) -> dict[str, str]:
    """The public half of `key` as a JWK, its `kid` the RFC 7638 thumbprint."""
    numbers = key.public_key().public_numbers()
    members = {"e": b64url(_int_bytes(numbers.e)), "kty": "RSA", "n": b64url(_int_bytes(numbers.n))}
    canonical = json.dumps(members, separators=(",", ":"), sort_keys=True).encode()
    return {**members, "kid": b64url(hashlib.sha256(canonical).digest()), "use": "sig", "alg": "RS256"}


def make_keys(directory: Path) -> None:
    """Write the signing key and its JWKS into `directory` unless they are there."""
    directory.mkdir(parents=True, exist_ok=True)
    key_path, jwks_path = directory / KEY_FILE, directory / JWKS_FILE
    if not key_path.exists():
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        descriptor = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as out:
            out.write(pem)
        jwks_path.unlink(missing_ok=True)
    if not jwks_path.exists():
        jwks_path.write_text(json.dumps({"keys": [public_jwk(load_key(directory))]}, indent=2) + "\n")


def load_key(directory: Path) -> rsa.RSAPrivateKey:
    """The signing key in `directory`."""
    key = serialization.load_pem_private_key((directory / KEY_FILE).read_bytes(), password=None)
    if not isinstance(key, rsa.RSAPrivateKey):
        raise SystemExit(f"{directory / KEY_FILE} is not an RSA key")
    return key


def sign(key: rsa.RSAPrivateKey, kid: str, claims: dict[str, Any]) -> str:
    """A compact JWS (RS256) over `claims` (RFC 7515, RFC 7518 §3.3)."""
    header = {"alg": "RS256", "typ": "at+jwt", "kid": kid}
    signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
    signature = key.sign(signing_input.encode("ascii"), padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input}.{b64url(signature)}"


class Issuer:
    """What the server knows: its signing key, where its clients are, and the claims every token carries."""

    def __init__(self, directory: Path, issuer: str, audience: str) -> None:
        self.directory = directory
        self.issuer = issuer
        self.audience = audience
        self.key = load_key(directory)
        self.kid = public_jwk(self.key)["kid"]

    def clients(self) -> dict[str, Any]:
        """The clients file, read now: the script that starts the server may rewrite it meanwhile."""
        loaded: dict[str, Any] = json.loads((self.directory / CLIENTS_FILE).read_text())
        return loaded

    def authenticate(self, authorization: str | None) -> str | None:
        """The client id that HTTP Basic `authorization` proves, or None."""
        scheme, _, encoded = (authorization or "").partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            client_id, _, secret = base64.b64decode(encoded, validate=True).decode().partition(":")
        except ValueError:
            return None
        # (each part form-encoded, RFC 6749 §2.3.1)
        client_id, secret = urllib.parse.unquote_plus(client_id), urllib.parse.unquote_plus(secret)
        client = self.clients().get(client_id)
        if not isinstance(client, dict) or not hmac.compare_digest(str(client.get("secret", "")), secret):
            return None
        return client_id

    def token(self, client_id: str, scope: str | None) -> dict[str, Any]:
        """The token endpoint's answer for an authenticated client (RFC 6749 §5.1)."""
        lifetime = int(self.clients()[client_id].get("lifetime_s", 3600))
        now = int(time.time())
        expires = now + lifetime
        claims = {
            "iss": self.issuer,
            "sub": client_id,
            "aud": self.audience,
            "client_id": client_id,
            "scope": scope or DEFAULT_SCOPE,
            # An expired token was issued before it expired.
            "iat": min(now, expires - 60),
            "exp": expires,
            "jti": uuid.uuid4().hex,
        }
        return {
            "access_token": sign(self.key, self.kid, claims),
            "token_type": "Bearer",
            "expires_in": max(lifetime, 0),
            "scope": claims["scope"],
        }


class Handler(BaseHTTPRequestHandler):
    """`POST /token` and `GET /jwks.json`; anything else is 404."""

    server: Server

    def do_GET(self) -> None:
        if self.path == "/jwks.json":
            self._answer(200, json.loads((self.server.issuer.directory / JWKS_FILE).read_text()))
        else:
            self._answer(404, {"error": "not_found"})

    def do_POST(self) -> None:
        if self.path != "/token":
            self._answer(404, {"error": "not_found"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._answer(413, {"error": "invalid_request"})
            return
        form = parse_qs(self.rfile.read(length).decode("utf-8", "replace"))
        client_id = self.server.issuer.authenticate(self.headers.get("Authorization"))
        if client_id is None:
            self._answer(401, {"error": "invalid_client"}, {"WWW-Authenticate": 'Basic realm="test issuer"'})
        elif form.get("grant_type") != ["client_credentials"]:
            self._answer(400, {"error": "unsupported_grant_type"})
        else:
            self._answer(200, self.server.issuer.token(client_id, form.get("scope", [""])[0] or None))

    def _answer(self, status: int, document: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


class Server(ThreadingHTTPServer):
    """The HTTP server, holding its issuer for the handlers."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], issuer: Issuer) -> None:
        super().__init__(address, Handler)
        self.issuer = issuer


def main(argv: list[str]) -> None:
    """`keys DIR` or `serve DIR --port --issuer --audience`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    keys = commands.add_parser("keys", help="make the signing key and the JWKS when missing")
    keys.add_argument("directory", type=Path)
    serve = commands.add_parser("serve", help="answer token requests")
    serve.add_argument("directory", type=Path)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--issuer", required=True, help="the tokens' `iss` (the broker expects it)")
    serve.add_argument("--audience", required=True, help="the tokens' `aud` (the broker expects it)")
    args = parser.parse_args(argv)
    if args.command == "keys":
        make_keys(args.directory)
        return
    server = Server((args.host, args.port), Issuer(args.directory, args.issuer, args.audience))
    print(f"oauth-issuer: serving http://{args.host}:{args.port}/token", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
