"""The framework's ceiling on this machine: FastAPI endpoints of the same shape as ours (same
paths, a JSON body parsed and validated, a JSON answer) that do no work.

Run: ``uvicorn --factory bench.baseline_app:create``."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel


class AuthorizationIn(BaseModel):
    api_key: str
    request_id: str | None = None
    model: str
    api: str
    prompt_tokens: int
    max_tokens: int | None = None
    n: int = 1
    reasoning: bool = False


class EventsIn(BaseModel):
    events: list[dict[str, Any]]


def create() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/authorizations")
    def authorize(body: AuthorizationIn) -> dict[str, Any]:
        return {
            "id": "auth_baseline",
            "object": "authorization",
            "status": "active",
            "request_id": body.request_id,
            "account_id": "acct_baseline",
            "api_key_id": "key_baseline",
            "model": body.model,
            "max_tokens": body.max_tokens,
            "estimate_microcents": 0,
            "credits_required_cents_estimate": 0,
            "expires_at": "2026-01-01T01:00:00.000000Z",
        }

    @app.delete("/v1/authorizations/{authorization_id}")
    def void(authorization_id: str) -> dict[str, Any]:
        return {"id": authorization_id, "object": "authorization", "status": "voided"}

    @app.post("/v1/usage/events")
    def ingest(body: EventsIn) -> dict[str, Any]:
        data = [
            {
                "index": i,
                "request_id": e.get("request_id"),
                "status": "recorded",
                "charge": None,
                "error": None,
            }
            for i, e in enumerate(body.events)
        ]
        return {
            "object": "list",
            "data": data,
            "recorded": len(data),
            "duplicates": 0,
            "quarantined": 0,
            "rejected": 0,
        }

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
