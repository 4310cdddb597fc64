"""The ASGI entry point for uvicorn workers: ``uvicorn --factory metering.asgi:create``."""

from __future__ import annotations

import gc

from fastapi import FastAPI

from metering.app import create_app
from metering.metrics import warn_if_per_worker
from metering.runtime import configure_logging, runtime_settings


def create() -> FastAPI:
    settings = runtime_settings()
    configure_logging(settings.log_level)
    warn_if_per_worker()
    app = create_app(settings)
    # Everything built so far lives as long as the process: keep it out of the collector's
    # scans, which otherwise cost tens of milliseconds per large ingest batch.
    gc.freeze()
    return app
