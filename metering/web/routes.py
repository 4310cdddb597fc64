"""The app's HTTP routes as served (prefixes and included routers resolved)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.routing import RouteContext, iter_route_contexts
from starlette.routing import Match
from starlette.types import Scope


def http_routes(app: FastAPI) -> list[RouteContext]:
    """Every route with methods (path operations and FastAPI's own pages), in matching order."""
    return [route for route in iter_route_contexts(app.routes) if route.methods]


def allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """Every method some route answers on the request's path (a 405's ``Allow``): Starlette
    names only those of the first route whose path matched, and one path may have several."""
    methods: set[str] = set()
    for route in http_routes(app):
        match, _ = route.matches(scope)
        if match is not Match.NONE:
            methods |= route.methods or set()
    return sorted(methods)
