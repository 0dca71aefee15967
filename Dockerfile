# The stream-export worker image (also runs the demo agents and the CLI).
# Runs as uid 10001 and writes only to /data (output) and /state (table store),
# so it works with a read-only root file system (the Helm chart sets one). No
# HEALTHCHECK here: the same image runs the demo agents, which serve no HTTP;
# docker-compose.yml and the chart probe the worker's /healthz and /readyz.

# uv turns uv.lock into a hash-pinned requirements file; uv itself stays out of
# the image. The range is pyproject.toml's [tool.uv] required-version.
FROM python:3.11-slim-bookworm AS lock
RUN pip install --no-cache-dir --disable-pip-version-check "uv>=0.13.9,<0.14"
WORKDIR /src
COPY pyproject.toml uv.lock ./
RUN uv export -q --frozen --no-emit-project --format requirements-txt -o /requirements.txt

FROM python:3.11-slim-bookworm
RUN useradd --create-home --uid 10001 app
WORKDIR /app
# The locked dependencies first, in a layer of their own: a change to the
# sources does not reinstall them, and every build gets the same versions.
COPY --from=lock /requirements.txt /tmp/requirements.txt
RUN pip install --no-cache-dir --disable-pip-version-check --no-deps --require-hashes \
      -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
COPY pyproject.toml README.md ./
COPY stream_export ./stream_export
COPY topics ./topics
RUN pip install --no-cache-dir --disable-pip-version-check --no-deps . \
    && mkdir -p /data /state && chown app:app /data /state
USER 10001
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    STREAM_EXPORT_SINK_OUTPUT_DIR=/data \
    STREAM_EXPORT_WORKER_DATA_DIR=/state \
    STREAM_EXPORT_HTTP_HOST=0.0.0.0
EXPOSE 9108
ENTRYPOINT ["stream-export"]
CMD ["worker"]
