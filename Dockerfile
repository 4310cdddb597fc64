# The metering image: API server, scheduler, migrations and exports are all `metering …`.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# Dependencies first, from the project's dependency list pinned by the lock: this layer is
# reused while only the code (or the README) changes.
COPY pyproject.toml requirements.lock ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/dependencies.txt \
    && pip install --constraint requirements.lock --requirement /tmp/dependencies.txt \
    && useradd --system --uid 10001 --home-dir /var/lib/metering --create-home metering \
    && mkdir -p /var/lib/metering/exports \
    && chown -R metering /var/lib/metering
# Then the code, without touching the dependencies installed above.
COPY README.md ./
COPY metering ./metering
RUN pip install --no-deps --constraint requirements.lock .

USER metering
ENV METERING_DATA_DIR=/var/lib/metering \
    METERING_EXPORT_DIR=/var/lib/metering/exports \
    METERING_DEMO=false
EXPOSE 8000
CMD ["metering", "serve", "--host", "0.0.0.0", "--port", "8000"]
