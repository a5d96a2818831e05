# graphile-worker for Python, as a container:
#
#   docker build -t graphile-worker .
#   docker run --rm -e DATABASE_URL=postgres://user:pass@db/app \
#     -v "$PWD/tasks:/worker/tasks:ro" -v "$PWD/crontab:/worker/crontab:ro" graphile-worker
#
# Arguments after the image name are the worker's flags (--jobs 4, --once, ...).
# tests/system/test_docker_image.py builds and runs it; tests/system/test_docker.py lints this
# file with hadolint and reproduces the image on the host (same wheel, same
# layout, same entrypoint), so keep the two in step.

# Build stage: the wheel, and a virtual environment holding it and its
# dependencies. Every dependency ships binary wheels, so no compiler is needed;
# pip's build backend stays in this stage.
FROM python:3.11-slim-bookworm AS builder

WORKDIR /src
COPY pyproject.toml README.md ./
COPY migrations ./migrations
COPY worker_cli ./worker_cli
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && python -m venv --without-pip /opt/venv \
    && pip --python /opt/venv/bin/python install --no-cache-dir /wheels/*.whl

# Final stage: Python, the virtual environment, and tini.
FROM python:3.11-slim-bookworm

# tini runs as PID 1: it passes SIGTERM/SIGINT on to the worker (which shuts
# down gracefully by itself) and reaps the child processes of executable tasks.
# Without it the worker would be PID 1, which ignores signals it has no handler
# for yet (a `docker stop` during start-up would wait for the kill timeout) and
# never reaps orphans.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini=0.19.0-1+b3 \
    && rm -rf /var/lib/apt/lists/*

RUN groupadd --system --gid 10001 worker \
    && useradd --uid 10001 --gid worker --no-create-home --home-dir /worker worker

COPY --from=builder /opt/venv /opt/venv

# PYTHONDONTWRITEBYTECODE: task folders are usually mounted read-only.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

# Mount the tasks at /worker/tasks and, optionally, a crontab at /worker/crontab:
# the worker's defaults (./tasks, ./crontab) find them.
WORKDIR /worker
USER 10001:10001

ENTRYPOINT ["/usr/bin/tini", "--", "graphile-worker"]
