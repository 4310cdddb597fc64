# The metering image: API server, scheduler, migrations and exports are all `metering …`.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# Dependencies first (their layer is reused while only the code changes), pinned by the lock.
COPY pyproject.toml requirements.lock README.md ./
COPY metering ./metering
RUN pip install --constraint requirements.lock . \
    && useradd --system --uid 10001 --home-dir /var/lib/metering --create-home metering \
    && mkdir -p /var/lib/metering/exports \
    && chown -R metering /var/lib/metering

USER metering
ENV METERING_DATA_DIR=/var/lib/metering \
    METERING_EXPORT_DIR=/var/lib/metering/exports \
    METERING_DEMO=false
EXPOSE 8000
CMD ["metering", "serve", "--host", "0.0.0.0", "--port", "8000"]
