"""``GET /v1/usage``: the caller's account usage per time bucket (docs/api.md#get-v1usage)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from metering.accounts.deps import AccountKeyDep
from metering.kit.timeutil import TIMESTAMP_OR_DATE_SCHEMA
from metering.reports import params, render, service
from metering.web.deps import NowDep, SessionDep
from metering.web.jsonio import MeteringRoute

router = APIRouter(prefix="/v1", route_class=MeteringRoute, tags=["usage reports"])

TIME = "An RFC 3339 timestamp with an offset, or a YYYY-MM-DD date (midnight UTC)."


def _enum(values: Iterable[str]) -> dict[str, Any]:
    """The schema of a text parameter checked against ``values`` by ``params``."""
    return {"enum": list(values)}


@router.get(
    "/usage",
    responses={
        200: {
            "description": "The report: JSON, or CSV with format=csv.",
            "content": {"application/json": {}, "text/csv": {"schema": {"type": "string"}}},
        }
    },
)
def usage_report(
    request: Request,
    session: SessionDep,
    key: AccountKeyDep,
    now: NowDep,
    starting_at: Annotated[
        str, Query(description=TIME, json_schema_extra=TIMESTAMP_OR_DATE_SCHEMA)
    ],
    ending_at: Annotated[
        str | None,
        Query(
            description=f"Exclusive; default: the end of the current bucket. {TIME}",
            json_schema_extra=TIMESTAMP_OR_DATE_SCHEMA,
        ),
    ] = None,
    bucket_width: Annotated[
        str | None,
        Query(description="1d (default) or 1h", json_schema_extra=_enum(params.BUCKET_WIDTHS)),
    ] = None,
    group_by: Annotated[
        str | None,
        Query(
            description="model (default), api_key, project or member",
            json_schema_extra=_enum(params.GROUP_BYS),
        ),
    ] = None,
    models: Annotated[list[str] | None, Query(description="Repeatable model filter")] = None,
    api_key_ids: Annotated[list[str] | None, Query(description="Repeatable key filter")] = None,
    project_ids: Annotated[list[str] | None, Query(description="Repeatable project filter")] = None,
    member_ids: Annotated[list[str] | None, Query(description="Repeatable member filter")] = None,
    output_format: Annotated[
        str | None,
        Query(alias="format", description="json or csv", json_schema_extra=_enum(params.FORMATS)),
    ] = None,
) -> Response:
    """Your account's requests, tokens and cost per UTC day or hour, by model, API key,
    project or member."""
    params.check_parameter_names(name for name, _ in request.query_params.multi_items())
    query = params.parse_report_query(
        starting_at=starting_at,
        ending_at=ending_at,
        bucket_width=bucket_width,
        group_by=group_by,
        models=models or (),
        api_key_ids=api_key_ids or (),
        output_format=output_format,
        now=now,
        project_ids=project_ids or (),
        member_ids=member_ids or (),
    )
    report = service.usage_report(session, key.account_id, key.billing, query)
    if query.output_format == "csv":
        span = "_".join(f"{t:%Y%m%dT%H%MZ}" for t in (query.starting_at, query.ending_at))
        return Response(
            render.report_csv(report).encode(),
            media_type="text/csv; charset=utf-8",
            headers={"content-disposition": f'attachment; filename="usage_{span}.csv"'},
        )
    return Response(render.report_json(report), media_type="application/json")
