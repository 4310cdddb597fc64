"""The portal's routes: sign-in (link or API key), sign-out, the pages, their static files, and
the operator's ``POST /admin/v1/accounts/{id}/portal-sessions``."""

from __future__ import annotations

import mimetypes
import secrets
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, urlsplit

from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from sqlalchemy.orm import Session

from metering.accounts.keys import resolve_key
from metering.accounts.schemas import Email
from metering.audit.deps import AuditDep
from metering.audit.service import Auditor
from metering.kit.errors import AuthenticationFailed, InvalidRequest, MeteringError, NotFound
from metering.kit.text import Text
from metering.kit.timeutil import format_timestamp
from metering.portal import mail, pages, roles, sessions, views
from metering.portal.sessions import PortalUser, public_base_url
from metering.portal.signing import Signer
from metering.reports import render as report_render
from metering.settings import Settings
from metering.usage import support as usage_support
from metering.web.deps import AdminDep, NowDep, SessionDep, get_clock, get_settings
from metering.web.errors import add_error_pages
from metering.web.jsonio import MeteringRoute
from metering.web.middleware import request_id_of

SESSION_COOKIE = "metering_portal"
NONCE_COOKIE = "metering_portal_nonce"  # binds the sign-in forms' CSRF tokens to a browser
CSRF_FIELD = "csrf_token"
MAX_FORM_BYTES = 8 * 1024
# An address as a member's is written: the one rule of the members' own routes.
EMAIL: TypeAdapter[str] = TypeAdapter(Email)
STATIC_DIR = Path(__file__).resolve().parent.parent / "web" / "static"
# Every file served under /billing/static, fixed when the process starts (no path is joined
# from a request, so nothing outside the directory can be named).
STATIC_FILES = {
    path.relative_to(STATIC_DIR).as_posix(): path
    for path in STATIC_DIR.rglob("*")
    if path.is_file() and path.suffix in (".js", ".css", ".md", ".txt")
}

router = APIRouter(prefix=pages.PREFIX, include_in_schema=False)
admin_router = APIRouter(
    prefix="/admin/v1", route_class=MeteringRoute, dependencies=[AdminDep], tags=["admin: portal"]
)


class SignInRequired(MeteringError):
    status = 401
    type = "authentication_error"
    default_code = "sign_in_required"


class PortalNotConfigured(MeteringError):
    status = 503
    type = "api_error"
    default_code = "portal_not_configured"


class CsrfRefused(MeteringError):
    status = 403
    type = "permission_error"
    default_code = "csrf_token_invalid"


def signer_of(request: Request) -> Signer:
    signer = Signer.of(get_settings(request).secret_key)
    if not signer.configured:
        raise PortalNotConfigured("the portal needs METERING_SECRET_KEY to be set")
    return signer


def _secure(request: Request, settings: Settings) -> bool:
    return request.url.scheme == "https" or settings.public_base_url.startswith("https://")


def _set_cookie(request: Request, response: Response, name: str, value: str, age: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=age,
        path=pages.PREFIX,
        httponly=True,
        samesite="lax",
        secure=_secure(request, get_settings(request)),
    )


async def form_of(request: Request) -> dict[str, str]:
    """An urlencoded form's fields (the first value of each), at most 8 KiB."""
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    body = await request.body()
    if not body:
        return {}  # no fields at all: the CSRF check refuses it
    if kind != "application/x-www-form-urlencoded":
        raise InvalidRequest("send the form as application/x-www-form-urlencoded")
    if len(body) > MAX_FORM_BYTES:
        raise InvalidRequest("the form is too large")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=20)
    except (UnicodeDecodeError, ValueError):
        raise InvalidRequest("the form could not be read") from None
    return {name: values[0] for name, values in fields.items()}


FormFields = dict[str, str]
FormDep = Annotated[FormFields, Depends(form_of)]


# -- who is signed in ----------------------------------------------------------------------------


def current_user(request: Request, session: SessionDep, now: NowDep) -> PortalUser:
    """The signed-in session of the request's cookie; otherwise the sign-in page (401)."""
    signer = signer_of(request)
    secret = signer.unsign(SESSION_COOKIE, request.cookies.get(SESSION_COOKIE))
    user = sessions.user_of(session, secret, now) if secret else None
    if user is None:
        raise SignInRequired("sign in to see your account")
    return user


UserDep = Annotated[PortalUser, Depends(current_user)]


class NotPermitted(MeteringError):
    status = 403
    type = "permission_error"
    default_code = "permission_denied"


def require(user: PortalUser, permission: roles.Permission) -> None:
    """A 403 page unless this session may do ``permission`` (roles.py holds who may)."""
    if not user.can(permission):
        raise NotPermitted("your role does not allow this here")


def csrf_token(request: Request, user: PortalUser) -> str:
    return signer_of(request).token("csrf", user.session_id)


def require_form_token(
    request: Request, purpose: str, subject: str | None, form: FormFields
) -> None:
    """Every form's CSRF check: sent from the portal's own origin (when the browser says where
    from), and the form's token was signed for ``purpose`` and ``subject`` (the session for a
    signed-in form, the browser's nonce for a sign-in form); 403 otherwise."""
    check_origin(request)
    signer = signer_of(request)
    if not subject or not signer.token_matches(purpose, subject, form.get(CSRF_FIELD)):
        raise CsrfRefused("the form's security token is missing or wrong: reload the page")


def _origin_of(url: str) -> str:
    parts = urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    port = f":{parts.port}" if parts.port and parts.port != default else ""
    return f"{parts.scheme}://{(parts.hostname or '').lower()}{port}"


def check_origin(request: Request) -> None:
    """A form sent from another origin is refused (403): the ``Origin`` a browser sends must be
    the address the request came to or the service's public address. A request without one
    (older browsers, non-browser clients) is left to the CSRF token."""
    origin = request.headers.get("origin")
    if origin is None:
        return
    own = {_origin_of(str(request.base_url))}
    public = get_settings(request).public_base_url
    if public:
        own.add(_origin_of(public))
    try:
        sent = _origin_of(origin.strip())
    except ValueError:
        sent = None
    if sent not in own:
        raise CsrfRefused(
            "the form was sent from another site: open the page here and send it again",
            code="cross_origin_form",
        )


def auditor_of(request: Request, user: PortalUser) -> Auditor:
    """The audit log's writer for a change the session makes: its actor is the member signed
    in (``portal:<mem_…>``), or the account for the owner's or a key's session."""
    return Auditor(user.actor, request_id_of(request.scope))


def check_csrf(request: Request, user: PortalUser, form: FormFields) -> None:
    require_form_token(request, "csrf", user.session_id, form)


def _nonce(request: Request) -> tuple[str, str | None]:
    """The browser's sign-in nonce, and the signed cookie to set when it has none yet."""
    signer = signer_of(request)
    nonce = signer.unsign(NONCE_COOKIE, request.cookies.get(NONCE_COOKIE))
    if nonce:
        return nonce, None
    nonce = secrets.token_urlsafe(16)
    return nonce, signer.sign(NONCE_COOKIE, nonce)


def _with_nonce(request: Request, response: Response, cookie: str | None) -> Response:
    if cookie is not None:
        _set_cookie(
            request, response, NONCE_COOKIE, cookie, int(sessions.SESSION_LIFETIME.total_seconds())
        )
    return response


def check_sign_in_csrf(request: Request, form: FormFields) -> None:
    nonce = signer_of(request).unsign(NONCE_COOKIE, request.cookies.get(NONCE_COOKIE))
    require_form_token(request, "sign-in", nonce, form)


def _signed_in(request: Request, session: Session, account_id: str, method: str) -> Response:
    secret = sessions.start_session(session, account_id, method, get_clock(request).now())
    response = pages.see_other(pages.PREFIX)
    _set_cookie(
        request,
        response,
        SESSION_COOKIE,
        signer_of(request).sign(SESSION_COOKIE, secret),
        int(sessions.SESSION_LIFETIME.total_seconds()),
    )
    return response


# -- signing in and out --------------------------------------------------------------------------


def sign_in_page(request: Request, status_code: int = 200, problem: str | None = None) -> Response:
    nonce, cookie = _nonce(request)
    response = pages.render(
        request,
        "sign_in.html",
        status_code=status_code,
        problem=problem,
        csrf=signer_of(request).token("sign-in", nonce),
        mail_on=get_settings(request).mail_on,
    )
    return _with_nonce(request, response, cookie)


@router.get("/sign-in")
def sign_in_form(request: Request) -> Response:
    return sign_in_page(request)


@router.post("/sign-in")
def sign_in_with_key(request: Request, form: FormDep, session: SessionDep) -> Response:
    check_sign_in_csrf(request, form)
    try:
        key = resolve_key(session, form.get("api_key", "").strip() or None, param=None)
    except AuthenticationFailed:
        return sign_in_page(request, 401, "That API key is not valid (or was revoked).")
    method = roles.method_of(roles.SessionKind.API_KEY, key.api_key_id)
    return _signed_in(request, session, key.account_id, method)


@router.post("/sign-in/email")
def email_a_link(request: Request, form: FormDep, session: SessionDep, now: NowDep) -> Response:
    """The sign-in page's "email me a sign-in link": recorded for the scheduler to send, and
    answered with the same page whether or not the address is a member's (metering.portal.mail)."""
    if not get_settings(request).mail_on:
        raise NotFound("sign-in links are not sent by email here (no METERING_SMTP_URL)")
    check_sign_in_csrf(request, form)
    try:
        address = EMAIL.validate_python(form.get("email", "").strip())
    except ValidationError:
        return sign_in_page(request, 400, "Enter your email address, such as ada@example.com.")
    mail.ask_for_link(session, address, now)
    return pages.render(request, "link_sent.html", address=address)


@router.get("/sign-in/{token}")
def confirm_link(token: str, request: Request, session: SessionDep, now: NowDep) -> Response:
    if not sessions.link_is_usable(session, token, now):
        return pages.render(request, "link_refused.html", status_code=410)
    nonce, cookie = _nonce(request)
    response = pages.render(
        request, "confirm.html", csrf=signer_of(request).token("sign-in", nonce), token=token
    )
    return _with_nonce(request, response, cookie)


@router.post("/sign-in/{token}")
def sign_in_with_link(
    token: str, request: Request, form: FormDep, session: SessionDep, now: NowDep
) -> Response:
    check_sign_in_csrf(request, form)
    spent = sessions.spend_link(session, token, now)
    if spent is None:
        return pages.render(request, "link_refused.html", status_code=410)
    account_id, member_id = spent
    method = (
        roles.method_of(roles.SessionKind.LINK)
        if member_id is None
        else roles.method_of(roles.SessionKind.MEMBER, member_id)
    )
    return _signed_in(request, session, account_id, method)


@router.post("/sign-out")
def sign_out(
    request: Request, form: FormDep, session: SessionDep, user: UserDep, now: NowDep
) -> Response:
    check_csrf(request, user, form)
    secret = signer_of(request).unsign(SESSION_COOKIE, request.cookies.get(SESSION_COOKIE))
    if secret:
        sessions.end_session(session, secret, now)
    response = pages.see_other(f"{pages.PREFIX}/sign-in")
    response.delete_cookie(SESSION_COOKIE, path=pages.PREFIX)
    return response


# -- errors are pages too -----------------------------------------------------------------------


def error_page(request: Request, error: MeteringError) -> Response:
    """The HTML form of an error under /billing (a sign-in page when the session is missing)."""
    if isinstance(error, SignInRequired):
        return sign_in_page(request, status_code=401, problem=error.message)
    request_id = request_id_of(request.scope)
    return pages.render(
        request,
        "error.html",
        status_code=error.status,
        headers={**error.headers, "x-request-id": request_id},
        status=error.status,
        message=error.message,
        code=error.code,
    )


def install_error_pages(app: FastAPI) -> None:
    """Errors under /billing are answered as pages, not as the API's JSON error body."""
    add_error_pages(app, pages.PREFIX, error_page)


# -- pages ---------------------------------------------------------------------------------------


def page_of(request: Request, user: PortalUser, template: str, **context: Any) -> HTMLResponse:
    """A signed-in page: the template with the user and the session's CSRF token."""
    return pages.render(request, template, user=user, csrf=csrf_token(request, user), **context)


@router.get("")
def overview(request: Request, user: UserDep, session: SessionDep, now: NowDep) -> Response:
    query = views.overview_query(now)
    report = views.report(session, user.account_id, user.billing, query)
    credits = views.credits(session, user.account_id, now)
    return page_of(
        request,
        user,
        "overview.html",
        credits=credits,
        grants=views.grants(session, user.account_id, credits, now),
        report=report,
        chart=views.chart_of(report),
    )


UsageParam = Annotated[str | None, Query(max_length=40)]


@router.get("/usage")
def usage(
    request: Request,
    user: UserDep,
    session: SessionDep,
    now: NowDep,
    starting_at: UsageParam = None,
    ending_at: UsageParam = None,
    bucket_width: UsageParam = None,
    group_by: UsageParam = None,
) -> Response:
    query = views.usage_query(now, starting_at, ending_at, bucket_width, group_by)
    report = views.report(session, user.account_id, user.billing, query)
    form = {
        "starting_at": _shown_time(query.starting_at, query.bucket_width),
        "ending_at": _shown_time(query.ending_at, query.bucket_width),
        "bucket_width": query.bucket_width,
        "group_by": query.group_by,
    }
    return page_of(
        request, user, "usage.html", report=report, chart=views.chart_of(report), form=form
    )


def _shown_time(at: datetime, width: str) -> str:
    return at.date().isoformat() if width == "1d" else format_timestamp(at)


@router.get("/usage.csv")
def usage_csv(
    user: UserDep,
    session: SessionDep,
    now: NowDep,
    starting_at: UsageParam = None,
    ending_at: UsageParam = None,
    bucket_width: UsageParam = None,
    group_by: UsageParam = None,
) -> Response:
    query = views.usage_query(now, starting_at, ending_at, bucket_width, group_by)
    report = views.report(session, user.account_id, user.billing, query)
    span = "_".join(f"{t:%Y%m%dT%H%MZ}" for t in (query.starting_at, query.ending_at))
    return _download(
        report_render.report_csv(report).encode(), "text/csv; charset=utf-8", f"usage_{span}.csv"
    )


@router.get("/activity")
def activity(request: Request, user: UserDep, session: SessionDep, now: NowDep) -> Response:
    found = views.activity(session, user.account_id, now)
    return page_of(request, user, "activity.html", **found)


@router.get("/requests")
def one_request(
    request: Request, user: UserDep, session: SessionDep, request_id: str = ""
) -> Response:
    """What one request cost (as ``GET /v1/requests/{request_id}``), found from Activity's
    search box; a request id the account has no recorded event of is a 404 page that says so."""
    wanted = request_id.strip()
    if not wanted:
        raise InvalidRequest("enter a request id to look up", param="request_id")
    try:
        found = usage_support.request_body(session, user.account_id, wanted)
    except NotFound:
        return page_of(request, user, "request.html", status_code=404, missing=wanted)
    return page_of(request, user, "request.html", found=found)


@router.get("/exports")
def exports(request: Request, user: UserDep) -> Response:
    export_dir = get_settings(request).export_dir
    return page_of(
        request,
        user,
        "exports.html",
        files=views.exports(export_dir, user.account_id),
        rollforward=views.rollforward(export_dir, user.account_id),
    )


@router.get("/exports/{day}/credits.csv")
def rollforward_file(day: str, request: Request, user: UserDep) -> Response:
    """The account's own rows of a day's credit roll-forward, as a CSV of the same columns."""
    for found in views.rollforward(get_settings(request).export_dir, user.account_id):
        if found.day.isoformat() == day:
            return _download(found.content, "text/csv; charset=utf-8", f"{day}_credits.csv")
    raise NotFound("no credit roll-forward rows of this account for that day")


def _download(content: bytes, media: str, filename: str) -> Response:
    return Response(
        content,
        media_type=media,
        headers={
            "content-disposition": f'attachment; filename="{filename}"',
            "cache-control": "no-store",
        },
    )


@router.get("/exports/{day}/{name}")
def export_file(day: str, name: str, request: Request, user: UserDep) -> Response:
    """One of the account's own export files, found in its day's manifest (never by a path
    made from the request)."""
    for file in views.exports(get_settings(request).export_dir, user.account_id):
        if file.day.isoformat() == day and file.name == name and file.path.is_file():
            media = (
                "text/csv; charset=utf-8"
                if file.format == "csv"
                else "application/vnd.apache.parquet"
            )
            return _download(file.path.read_bytes(), media, f"{day}_{name}")
    raise NotFound("no such export file of this account")


@router.get("/models")
def models(request: Request, user: UserDep, session: SessionDep, now: NowDep) -> Response:
    return page_of(request, user, "models.html", models=views.models(session, user.account_id, now))


@router.get("/static/{name:path}")
def static(name: str) -> Response:
    path = STATIC_FILES.get(name)
    if path is None:
        raise NotFound(f"no static file {name!r}")
    media = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    if media.startswith("text/") or media.endswith("javascript"):
        media += "; charset=utf-8"
    return Response(
        path.read_bytes(),
        media_type=media,
        headers={"cache-control": "max-age=86400", "x-content-type-options": "nosniff"},
    )


# -- the operator's sign-in links ----------------------------------------------------------------


class PortalSessionCreate(BaseModel):
    """``POST /admin/v1/accounts/{id}/portal-sessions``' optional body."""

    model_config = ConfigDict(extra="forbid")

    member_id: Annotated[Text, Field(min_length=1, max_length=64)] | None = None


_NO_MEMBER = PortalSessionCreate()


@admin_router.post("/accounts/{account_id}/portal-sessions", status_code=201)
def create_portal_session(
    account_id: str,
    request: Request,
    session: SessionDep,
    now: NowDep,
    audit: AuditDep,
    # Optional: no body (or ``{}``) signs in as the account's owner.
    body: PortalSessionCreate = _NO_MEMBER,
) -> dict[str, Any]:
    """A single-use sign-in link to the account's billing portal, valid for 15 minutes: as
    the member ``member_id`` (with its role), or without one as the account's owner."""
    member_id = body.member_id
    link = sessions.create_link(
        session, account_id, public_base_url(get_settings(request)), now, member_id
    )
    expires_at = format_timestamp(link.expires_at)
    audit.record(
        session,
        now,
        "portal_session.create",
        "account",
        account_id,
        account_id,
        {"expires_at": expires_at, **({"member_id": member_id} if member_id else {})},
    )
    return {
        "object": "portal_session",
        "account_id": account_id,
        "member_id": member_id,
        "url": link.url,
        "expires_at": expires_at,
    }
