"""``/docs`` (Swagger UI) and ``/redoc``, with their scripts and styles served by the service
itself (from the pinned ``fastapi-offline`` package), so the pages work offline and load
nothing from a CDN."""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter, Request, Response
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse

from metering.kit.errors import NotFound

ASSETS_PATH = "/docs/assets"
# The files the pages load, and their types: nothing else is served from the package.
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}
_STATIC = files("fastapi_offline") / "static"

router = APIRouter(include_in_schema=False)


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url=request.app.openapi_url,
        title=f"{request.app.title}: API",
        swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
        swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
        swagger_favicon_url=f"{ASSETS_PATH}/favicon.png",
        oauth2_redirect_url=None,
        # Not the public validator's badge: the page asks nothing of any other host.
        swagger_ui_parameters={"validatorUrl": None},
    )


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(
        openapi_url=request.app.openapi_url,
        title=f"{request.app.title}: API",
        redoc_js_url=f"{ASSETS_PATH}/redoc.standalone.js",
        redoc_favicon_url=f"{ASSETS_PATH}/favicon.png",
        with_google_fonts=False,
    )


@router.get(ASSETS_PATH + "/{name}")
async def asset(name: str) -> Response:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise NotFound(f"no asset {name!r}", param="name")
    content = (_STATIC / name).read_bytes()
    return Response(content, media_type=media_type, headers={"cache-control": "max-age=86400"})
