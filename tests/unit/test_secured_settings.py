"""Secured infrastructure's settings (contract §11): every secret also from a file, Kafka's TLS and SASL settings that
go together, libpq's TLS parameters turned into the driver's, downstream credentials; and no secret in any line a
bad setting gives. No I/O but temporary files."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.adapters.http import Credentials
from service.config import ConfigurationError, load_settings, secret_fields
from service.orders.settings import OrderSettings
from service.store.connect import DatabaseUrlError, database

CANARY = "canary-Zq7-secret"


@pytest.fixture(autouse=True)
def _no_orders_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets its own ORDERS_ variables."""
    import os

    for name in list(os.environ):
        if name.startswith("ORDERS_"):
            monkeypatch.delenv(name)


def test_the_secrets_are_exactly_the_contracts() -> None:
    assert set(secret_fields(OrderSettings)) == {
        "database_url",
        "database_password",
        "kafka_sasl_password",
        "kafka_oauth_client_secret",
        "console_tokens",
        "customers_token",
        "payments_token",
        "emails_token",
    }


@pytest.mark.parametrize("field", secret_fields(OrderSettings))
def test_every_secret_may_come_from_a_file_one_trailing_newline_ignored(
    field: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a secret mounted as a file, as Kubernetes and Docker do (with the newline an editor adds)
    value = {
        "database_url": "postgresql+asyncpg://svc:pw@db.internal:5432/orders",
        "console_tokens": f"ann:operator:{'t' * 40}",
    }.get(field, CANARY)
    path = tmp_path / "secret"
    path.write_text(value + "\n")
    monkeypatch.setenv(f"ORDERS_{field.upper()}_FILE", str(path))

    # When the settings are read, Then the setting holds the file's value without the newline
    loaded = getattr(load_settings(OrderSettings), field)
    assert loaded.get_secret_value() == value


def test_a_secret_given_both_ways_is_one_line_and_exit_2_without_the_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "secret"
    path.write_text(CANARY)
    monkeypatch.setenv("ORDERS_KAFKA_SASL_PASSWORD", CANARY)
    monkeypatch.setenv("ORDERS_KAFKA_SASL_PASSWORD_FILE", str(path))

    with pytest.raises(ConfigurationError) as refused:
        load_settings(OrderSettings)

    message = str(refused.value)
    assert message == (
        "invalid configuration: ORDERS_KAFKA_SASL_PASSWORD and ORDERS_KAFKA_SASL_PASSWORD_FILE are both set: "
        "give the secret one way"
    )
    assert CANARY not in message


def test_a_secret_file_that_cannot_be_read_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORDERS_DATABASE_PASSWORD_FILE", str(tmp_path / "missing"))

    with pytest.raises(
        ConfigurationError, match=r"^invalid configuration: ORDERS_DATABASE_PASSWORD_FILE: cannot read "
    ):
        load_settings(OrderSettings)


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (
            {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512"},
            "ORDERS_KAFKA_SASL_USERNAME: needed with ORDERS_KAFKA_SASL_MECHANISM=SCRAM-SHA-512",
        ),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_USERNAME": "svc"},
            "ORDERS_KAFKA_SASL_PASSWORD: needed with ORDERS_KAFKA_SASL_MECHANISM=PLAIN",
        ),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_MECHANISM": "OAUTHBEARER"},
            "ORDERS_KAFKA_OAUTH_TOKEN_URL: needed with ORDERS_KAFKA_SASL_MECHANISM=OAUTHBEARER",
        ),
        (
            {
                "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "KAFKA_SASL_MECHANISM": "OAUTHBEARER",
                "KAFKA_OAUTH_TOKEN_URL": "ftp://idp/token",
                "KAFKA_OAUTH_CLIENT_ID": "svc",
                "KAFKA_OAUTH_CLIENT_SECRET": CANARY,
            },
            "ORDERS_KAFKA_OAUTH_TOKEN_URL: must be an https:// (or http://) URL",
        ),
        (
            {"KAFKA_SSL_CAFILE": "/etc/hosts"},
            "ORDERS_KAFKA_SSL_CAFILE: has no use with ORDERS_KAFKA_SECURITY_PROTOCOL=PLAINTEXT; use SSL or SASL_SSL",
        ),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CERTFILE": "/etc/hosts"},
            "ORDERS_KAFKA_SSL_CERTFILE and ORDERS_KAFKA_SSL_KEYFILE: the client certificate needs its key",
        ),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CAFILE": "/nonexistent/ca.pem"},
            "ORDERS_KAFKA_SSL_CAFILE: no readable file at /nonexistent/ca.pem",
        ),
        (
            {"PAYMENTS_URL": "http://payments.internal", "PAYMENTS_CA_FILE": "/etc/hosts"},
            "ORDERS_PAYMENTS_CA_FILE / _CERT_FILE: need an https:// ORDERS_PAYMENTS_URL",
        ),
        (
            {"EMAILS_KEY_FILE": "/etc/hosts"},
            "ORDERS_EMAILS_CERT_FILE and ORDERS_EMAILS_KEY_FILE: the client certificate needs its key",
        ),
        # A secret never travels in clear beyond this machine
        (
            {"PAYMENTS_URL": "http://payments.example.com", "PAYMENTS_TOKEN": CANARY},
            "ORDERS_PAYMENTS_TOKEN: needs an https:// ORDERS_PAYMENTS_URL (http:// only to a loopback address: the "
            "token would travel in clear)",
        ),
        (
            {
                "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "KAFKA_SASL_MECHANISM": "OAUTHBEARER",
                "KAFKA_OAUTH_TOKEN_URL": "http://idp.example.com/token",
                "KAFKA_OAUTH_CLIENT_ID": "svc",
                "KAFKA_OAUTH_CLIENT_SECRET": CANARY,
            },
            "ORDERS_KAFKA_OAUTH_TOKEN_URL: must be https:// (http:// only to a loopback address: the client secret "
            "would travel in clear)",
        ),
    ],
)
def test_security_settings_that_do_not_go_together_are_one_line(
    variables: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(f"ORDERS_{name}", value)

    with pytest.raises(ConfigurationError) as refused:
        load_settings(OrderSettings)

    assert str(refused.value) == f"invalid configuration: {message}"
    assert CANARY not in str(refused.value)


def test_kafka_over_scram_and_tls_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "KAFKA_SASL_USERNAME": "svc",
        "KAFKA_SASL_PASSWORD": CANARY,
    }.items():
        monkeypatch.setenv(f"ORDERS_{name}", value)

    loaded = load_settings(OrderSettings)

    assert (loaded.kafka_security_protocol, loaded.kafka_sasl_mechanism, loaded.kafka_sasl_username) == (
        "SASL_SSL",
        "SCRAM-SHA-512",
        "svc",
    )
    assert CANARY not in repr(loaded)


# ---------------------------------------------------------------------------------------------- the database


def test_a_database_url_is_shown_with_its_password_hidden_and_the_password_setting_wins() -> None:
    given = database("postgresql+asyncpg://svc:in-url@db.internal:5432/orders", password=CANARY)

    assert given.url.password == CANARY
    assert given.shown == "postgresql+asyncpg://svc:***@db.internal:5432/orders"


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", None),
        ("?sslmode=disable", False),
        ("?sslmode=prefer", "prefer"),
        ("?sslmode=allow", "allow"),
    ],
)
def test_libpqs_modes_without_verification_are_asyncpgs_own(query: str, expected: object) -> None:
    assert database(f"postgresql+asyncpg://svc@db:5432/orders{query}").ssl == expected


@pytest.mark.parametrize(
    ("mode", "verify", "hostname"),
    [
        ("require", ssl.CERT_NONE, False),
        ("verify-full", ssl.CERT_REQUIRED, True),
    ],
)
def test_libpqs_verifying_modes_become_a_tls_context_that_verifies_as_they_say(
    mode: str, verify: ssl.VerifyMode, hostname: bool
) -> None:
    # (without sslrootcert: the system's CAs, as the service's documentation says)
    given = database(f"postgresql+asyncpg://svc@db:5432/orders?sslmode={mode}&application_name=x")

    assert isinstance(given.ssl, ssl.SSLContext)
    assert (given.ssl.verify_mode, given.ssl.check_hostname) == (verify, hostname)
    assert dict(given.url.query) == {"application_name": "x"}  # the driver's keywords: no sslmode left


def test_verify_ca_checks_the_certificate_against_its_root_certificate_only(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text(_self_signed())

    given = database(f"postgresql+asyncpg://svc@db:5432/orders?sslmode=verify-ca&sslrootcert={ca}")

    assert isinstance(given.ssl, ssl.SSLContext)
    assert (given.ssl.verify_mode, given.ssl.check_hostname) == (ssl.CERT_REQUIRED, False)


def test_an_encrypted_client_key_is_refused_in_one_line_not_asked_for(tmp_path: Path) -> None:
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    cert.write_text(_self_signed(key_file=key, passphrase=b"secret-42"))

    with pytest.raises(DatabaseUrlError, match="sslcert/sslkey: not a certificate and its key"):
        database(f"postgresql+asyncpg://svc@db:5432/orders?sslmode=verify-full&sslcert={cert}&sslkey={key}")


def test_require_with_a_root_certificate_verifies_as_libpq_does(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text(_self_signed())

    given = database(f"postgresql+asyncpg://svc@db:5432/orders?sslmode=require&sslrootcert={ca}")

    assert isinstance(given.ssl, ssl.SSLContext)
    assert given.ssl.verify_mode == ssl.CERT_REQUIRED


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("?sslmode=verify", "sslmode=verify is not one of disable, allow, prefer, require, verify-ca, verify-full"),
        ("?sslmode=verify-full&sslrootcert=/nonexistent.pem", "sslrootcert: no readable file at /nonexistent.pem"),
        ("?sslmode=verify-full&sslcert=/etc/hosts", "sslcert and sslkey go together"),
        # The system's CAs without the host name would take any public certificate: libpq refuses it too
        ("?sslmode=verify-ca", "sslmode=verify-ca needs sslrootcert"),
    ],
)
def test_tls_parameters_that_cannot_be_used_are_refused(query: str, message: str) -> None:
    with pytest.raises(DatabaseUrlError, match=message):
        database(f"postgresql+asyncpg://svc:{CANARY}@db:5432/orders{query}")


def test_a_bad_tls_parameter_is_one_configuration_line_without_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORDERS_DATABASE_URL", f"postgresql+asyncpg://svc:{CANARY}@db:5432/orders?sslmode=on")

    with pytest.raises(ConfigurationError) as refused:
        load_settings(OrderSettings)

    assert str(refused.value).startswith("invalid configuration: ORDERS_DATABASE_URL: sslmode=on is not one of ")
    assert CANARY not in str(refused.value)


# ---------------------------------------------------------------------------------------------- downstreams


def test_a_downstreams_credentials_are_read_from_its_own_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORDERS_PAYMENTS_TOKEN", CANARY)

    loaded = load_settings(OrderSettings)
    payments, customers = Credentials.of(loaded, "payments"), Credentials.of(loaded, "customers")

    assert payments.token is not None
    assert payments.token.get_secret_value() == CANARY
    assert (customers, Credentials.of(loaded, "stock")) == (Credentials(), Credentials())
    assert payments.tls() is None


@settings(max_examples=60, deadline=None)
@given(
    variable=st.sampled_from(
        ["KAFKA_SASL_PASSWORD", "KAFKA_OAUTH_CLIENT_SECRET", "PAYMENTS_TOKEN", "DATABASE_PASSWORD"]
    ),
    secret=st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=8, max_size=40),
    broken=st.sampled_from(
        [("KAFKA_SECURITY_PROTOCOL", "SASL_SSL"), ("BATCH_SIZE", "0"), ("RETRY_TIERS", "soon"), ("MAX_ATTEMPTS", "x")]
    ),
)
def test_no_configuration_error_shows_a_secret(variable: str, secret: str, broken: tuple[str, str]) -> None:
    # Given any secret and another setting that is wrong
    import os

    saved = dict(os.environ)
    os.environ[f"ORDERS_{variable}"] = secret
    os.environ[f"ORDERS_{broken[0]}"] = broken[1]
    try:
        # When the settings are read, Then the one line names the setting, never the secret
        with pytest.raises(ConfigurationError) as refused:
            load_settings(OrderSettings)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert secret not in str(refused.value)


def _self_signed(key_file: Path | None = None, passphrase: bytes | None = None) -> str:
    """A CA certificate in PEM (generated: no file of the repository holds a key); its key written to `key_file`,
    encrypted with `passphrase`, when given."""
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    if key_file is not None:
        encryption = serialization.BestAvailableEncryption(passphrase) if passphrase else serialization.NoEncryption()
        key_file.write_bytes(
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
        )
    return certificate.public_bytes(serialization.Encoding.PEM).decode()


# ---------------------------------------------------------------------------------------------- OAuth tokens


async def test_a_token_is_kept_until_shortly_before_it_expires_and_fetched_once_for_concurrent_callers() -> None:
    import asyncio

    from pydantic import SecretStr

    from service.adapters.oauth import ClientCredentials

    # Given a provider whose endpoint hands out numbered tokens valid 100 s, on a clock the test moves
    now = [0.0]
    provider = ClientCredentials("https://idp/token", "svc", SecretStr(CANARY), clock=lambda: now[0])
    fetched: list[str] = []

    async def fetch() -> tuple[str, float]:
        fetched.append(f"t{len(fetched) + 1}")
        await asyncio.sleep(0)
        return fetched[-1], 100.0

    provider._fetch = fetch  # type: ignore[method-assign]

    # When many connections ask at once, and again later
    first = await asyncio.gather(*(provider.token() for _ in range(5)))
    now[0] = 39.0
    still = await provider.token()
    now[0] = 40.0
    renewed = await provider.token()

    # Then one token served them all, kept until a minute before it expires (sooner than 80 % of its life here),
    # then the next one
    assert (first, still, renewed, fetched) == (["t1"] * 5, "t1", "t2", ["t1", "t2"])


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'{"access_token": "abc", "expires_in": 30}', ("abc", 30.0)),
        (b'{"access_token": "abc"}', ("abc", 3600.0)),
        (b'{"access_token": "abc", "expires_in": true}', ("abc", 3600.0)),
        (b'{"access_token": "abc", "expires_in": "299"}', ("abc", 299.0)),
        (b'{"access_token": "abc", "expires_in": "soon"}', ("abc", 3600.0)),
    ],
)
def test_a_token_answer_gives_the_token_and_its_lifetime(content: bytes, expected: tuple[str, float]) -> None:
    from service.adapters.oauth import _token_of

    assert _token_of(content) == expected


@pytest.mark.parametrize("content", [b"<html>", b"{}", b'{"access_token": ""}', b"[]"])
def test_an_answer_without_a_token_is_an_outage_not_a_crash(content: bytes) -> None:
    from service.adapters.oauth import _token_of
    from service.errors import TokenUnavailable

    with pytest.raises(TokenUnavailable):
        _token_of(content)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8080", "http://localhost:8080/v1", "http://[::1]:8080", "https://p.example"]
)
def test_a_downstream_token_may_go_over_http_to_a_local_sidecar_only(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORDERS_PAYMENTS_URL", url)
    monkeypatch.setenv("ORDERS_PAYMENTS_TOKEN", CANARY)

    assert load_settings(OrderSettings).payments_token is not None
