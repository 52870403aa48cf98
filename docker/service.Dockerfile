# The REST service: `autoshard serve` (uvicorn) with its solver worker processes, CPU only.
#
# Build from the repository root:
#   docker build -f docker/service.Dockerfile -t autoshard-service .
# Run on a SQLite file in a volume (or set AUTOSHARD_DATABASE_URL to a PostgreSQL URL, see compose.yaml):
#   docker run -p 8000:8000 -v autoshard-data:/data autoshard-service
# The command and the health check are the ones the tests run outside Docker (tests/service/test_e2e.py).
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/autoshard PATH=/opt/autoshard/bin:$PATH \
    AUTOSHARD_HOST=0.0.0.0 AUTOSHARD_PORT=8000 AUTOSHARD_WORKERS=2 \
    AUTOSHARD_DATABASE_URL=sqlite:////data/autoshard.db
RUN python -m venv "$VIRTUAL_ENV"

# torch first, pinned and CPU-only (the default Linux wheel is the CUDA build), then the project: a layer of
# its own, so a change to the project does not download torch again.
# hadolint ignore=DL3059
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"
WORKDIR /app
COPY pyproject.toml README.md ./
COPY autoshard autoshard
COPY solver solver
COPY strategies strategies
COPY runtime runtime
COPY service service
RUN pip install . \
    && useradd --create-home --uid 1000 autoshard \
    && mkdir /data && chown autoshard /data
USER 1000
# The solver's and the cost model's numba kernels compiled into the image, in the service user's numba cache
# (~/.cache/numba: numba skips a cache directory it cannot write, such as the installed package's): otherwise
# every job process of a fresh container compiles them first, tens of seconds. From / so that the installed
# package is imported, as `autoshard serve` and its job processes import it, not the sources in /app.
WORKDIR /
RUN python -m strategies.plan.warm_up
WORKDIR /app
VOLUME /data
EXPOSE 8000

HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD ["python", "-m", "service.healthcheck"]
CMD ["autoshard", "serve"]
