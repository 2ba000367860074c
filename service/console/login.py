"""The console's door: probes without a login, the login form, and logging out."""

from __future__ import annotations

import re
import secrets

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from service.console.sessions import COOKIE
from service.console.web import (
    Refused,
    caller,
    checked_form,
    client_of,
    log,
    render,
    safe_next,
    state_of,
)
from service.explain import explain
from service.policy.operators import match
from service.store.uow import UnitOfWork, ping

LOGIN_COOKIE = "console_login"  # the login form's CSRF token (double submit), before there is a session
_LOGIN_TOKEN = re.compile(r"[A-Za-z0-9_-]{32}")  # what `secrets.token_urlsafe(24)` makes


async def favicon(request: Request) -> Response:
    """No icon (the browser asks for one on every page; answered without a login, and cheaply)."""
    return Response(status_code=204)


async def healthz(request: Request) -> Response:
    """Liveness, without authentication: the process answers."""
    return PlainTextResponse("ok")


async def readyz(request: Request) -> Response:
    """Readiness, without authentication: the database answers (503 with the reason in one line otherwise)."""
    try:
        await ping(state_of(request).wiring.engine)
    except Exception as error:
        return PlainTextResponse(f"not ready: {explain(error, state_of(request).wiring.settings)}", status_code=503)
    return PlainTextResponse("ready")


async def login_form(request: Request, *, error: str = "", status: int = 200) -> Response:
    """The login form, with a double-submit CSRF token in a cookie of its own: the one the browser holds, if any,
    so that a request the page did not make (the browser's own `/favicon.ico`, sent here as it is not logged in)
    or a second tab does not replace the token of the form already shown."""
    held = request.cookies.get(LOGIN_COOKIE, "")
    token = held if _LOGIN_TOKEN.fullmatch(held) else secrets.token_urlsafe(24)
    response = render(
        request,
        "login.html",
        {"login_csrf": token, "next": safe_next(request.query_params.get("next", "/")), "error": error},
        status=status,
    )
    response.set_cookie(LOGIN_COOKIE, token, max_age=600, httponly=True, samesite="strict", secure=_secure(request))
    return response


def _secure(request: Request) -> bool:
    return state_of(request).wiring.settings.console_behind_tls


async def login(request: Request) -> Response:
    """Exchange a token for a session cookie; failures are counted per client, logged without the token."""
    state = state_of(request)
    client = client_of(request)
    form = await request.form()
    given_csrf = str(form.get("csrf", ""))
    expected = request.cookies.get(LOGIN_COOKIE, "")
    if not expected or not secrets.compare_digest(given_csrf.encode(), expected.encode()):
        raise Refused(403, "the login form is stale or forged (no valid CSRF token): reload the page")
    wait = state.limiter.blocked(client)
    if wait is not None:
        log.warning("console.login_limited", client=client)
        response = await login_form(request, error=f"too many failed logins: try again in {int(wait) + 1}s", status=429)
        response.headers["retry-after"] = str(int(wait) + 1)
        return response
    operator = match(state.operators, str(form.get("token", "")).strip())
    if operator is None:
        state.limiter.failed(client)
        log.warning("console.login_failed", client=client)
        return await login_form(request, error="that token is not valid", status=401)
    async with UnitOfWork(state.wiring.engine) as uow:
        cookie, _ = await state.sessions.issue(uow.connection, operator)
        await uow.commit()
    log.info("console.login", actor=operator.name, role=operator.role, client=client)
    response = RedirectResponse(safe_next(str(form.get("next", "/"))), status_code=303)
    response.set_cookie(
        COOKIE,
        cookie,
        max_age=int(state.sessions.ttl_seconds),
        httponly=True,
        samesite="strict",
        secure=_secure(request),
        path="/",
    )
    response.delete_cookie(LOGIN_COOKIE)
    return response


async def logout(request: Request) -> Response:
    """End the session: its row is revoked, so the cookie, were it kept or copied, opens nothing on any replica."""
    who = caller(request)
    await checked_form(request, who)
    async with UnitOfWork(state_of(request).wiring.engine) as uow:
        await state_of(request).sessions.end(uow.connection, request.cookies.get(COOKIE))
        await uow.commit()
    log.info("console.logout", actor=who.operator.name)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response
