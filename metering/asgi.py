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
    # A batch makes several objects per event, nearly all freed by their reference counts, not
    # by the collector, which at the default thresholds (700, 10, 10) scanned the live ones
    # each time 700 more had been made. Less often: 3% fewer of the server's instructions per
    # event in a batch (docs/performance.md).
    gc.set_threshold(50_000, 20, 100)
    return app
