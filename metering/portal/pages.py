"""Rendering the portal's HTML: the Jinja2 templates, the headers every page carries and the
exact money filters."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from fastapi import Request, Response
from fastapi.responses import HTMLResponse
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup, escape

from metering.kit.money import scaled_text, usd_text
from metering.kit.timeutil import format_timestamp
from metering.reports.service import Report
from metering.states.payments import PaymentStatus
from metering.web.middleware import request_id_of

PREFIX = "/billing"
STATIC = f"{PREFIX}/static"
CHART_JS = f"{STATIC}/vendor/chart.js-4.5.1/chart.umd.min.js"
# Everything is served by the service itself; no inline script or style, no other origin.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    # A sign-in link's token is in the page's URL: never send it to another site as a Referer.
    # Same-origin (not no-referrer): the browser then sends the portal's own Origin with its
    # forms, which the Origin check requires ("null" is what any site can make a browser send).
    "referrer-policy": "same-origin",
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}


def money(microcents: int | None) -> str:
    """An exact dollar amount: ``$0.0008746``, ``-$1.5``; an em dash for none."""
    if microcents is None:
        return "—"
    text = usd_text(abs(microcents))
    whole, _, fraction = text.partition(".")
    if len(fraction) < 2:
        fraction = fraction.ljust(2, "0")
    return f"{'-' if microcents < 0 else ''}${whole}.{fraction}"


def dollars_field(microcents: int | None) -> str:
    """An amount as a form's dollars field holds it (``25.5``), exact; empty for none."""
    return "" if microcents is None else usd_text(microcents)


def count(value: int) -> str:
    return f"{value:,}"


def cents_text(microcents: int) -> str:
    return scaled_text(microcents, 6)


def when(value: datetime | None) -> str:
    return format_timestamp(value) if value is not None else "—"


def json_script(value: Any) -> Markup:
    """JSON safe inside a ``<script type="application/json">`` element."""
    text = json.dumps(value, separators=(",", ":"))
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return Markup(text)


def report_rows(report: Report) -> Markup:
    """The report table's body: one row per bucket and group. Written here rather than by the
    template: 93 days by 50 keys is 4,650 rows, which a template loop renders five times slower
    than the report itself takes. Every text is escaped; amounts are exact (``money``)."""
    by_key = report.query.group_by == "api_key"
    names = report.key_names
    labels: dict[str, str] = {}
    billed = report.billed
    parts = []
    for bucket in report.buckets:
        start = f'<tr class="result"><td>{format_timestamp(bucket.starting_at)}</td><td>'
        for key, requests, input_tokens, cache_read, output_tokens, cost in bucket.rows(
            "requests", "input_tokens", "cache_read_tokens", "output_tokens", "cost_microcents"
        ):
            label = labels.get(key)
            if label is None:
                if by_key:
                    label = f"{escape(names.get(key, ''))} <code>{escape(key)}</code>"
                else:
                    label = str(escape(key))
                labels[key] = label
            parts.append(
                f'{start}{label}</td><td class="num">{requests:,}</td>'
                f'<td class="num">{input_tokens:,}</td><td class="num">{cache_read:,}</td>'
                f'<td class="num">{output_tokens:,}</td>'
                f'<td class="num">{money(cost) if billed else "not billed"}</td></tr>\n'
            )
    return Markup("".join(parts))


ENVIRONMENT = Environment(
    loader=PackageLoader("metering.portal", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
ENVIRONMENT.filters.update(
    money=money,
    dollars_field=dollars_field,
    count=count,
    when=when,
    json_script=json_script,
    report_rows=report_rows,
)
# States are compared with their enums (metering.states), never with a bare string.
ENVIRONMENT.globals.update(
    static=STATIC, chart_js=CHART_JS, prefix=PREFIX, PaymentStatus=PaymentStatus
)


def render(
    request: Request,
    template: str,
    status_code: int = 200,
    headers: dict[str, str] | None = None,
    **context: Any,
) -> HTMLResponse:
    settings = getattr(request.app.state, "settings", None)
    body = ENVIRONMENT.get_template(template).render(
        request_id=request_id_of(request.scope),
        path=request.url.path,
        payments_on=bool(settings is not None and settings.payments_on),
        **context,
    )
    return HTMLResponse(
        body, status_code=status_code, headers={**SECURITY_HEADERS, **(headers or {})}
    )


def see_other(location: str) -> Response:
    """The 303 after a form's POST (the browser then GETs ``location``)."""
    return Response(status_code=303, headers={"location": location, **SECURITY_HEADERS})
