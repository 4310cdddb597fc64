"""The ASGI entry point for uvicorn workers: ``uvicorn --factory metering.asgi:create``."""

from __future__ import annotations

from fastapi import FastAPI

from metering.app import create_app
from metering.runtime import configure_logging, runtime_settings


def create() -> FastAPI:
    settings = runtime_settings()
    configure_logging(settings.log_level)
    return create_app(settings)
