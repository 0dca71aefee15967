# The stream-export worker image (also runs the demo agents and the CLI).
# Runs as uid 10001 and writes only to /data (output) and /state (table store),
# so it works with a read-only root file system (the Helm chart sets one). No
# HEALTHCHECK here: the same image runs the demo agents, which serve no HTTP;
# docker-compose.yml and the chart probe the worker's /healthz and /readyz.
#
# Build: docker build -t stream-export:0.1.0 .   (docker compose up builds it too)
#
# Base image policy: an exact Python patch release on a named Debian release
# (never a floating tag like 3.11-slim). Raising it is a reviewed one-line change
# here and in dev/versions.env (PYTHON_IMAGE; tests/unit/test_packaging.py keeps
# both equal). To pin the bytes as well, pass the digest your registry reports:
#   docker build --build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:... .
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# uv turns uv.lock into hash-pinned requirements files; uv itself stays out of
# the image. The range is pyproject.toml's [tool.uv] required-version.
FROM ${PYTHON_IMAGE} AS lock
RUN pip install --no-cache-dir --disable-pip-version-check "uv>=0.13.9,<0.14"
WORKDIR /src
COPY pyproject.toml uv.lock ./
RUN uv export -q --frozen --no-emit-project --extra s3 --format requirements-txt -o /requirements.txt \
    && uv export -q --frozen --no-emit-project --only-group build --format requirements-txt \
      -o /build-requirements.txt

# The wheel, built by the locked hatchling (no build isolation, which would take
# whatever hatchling is newest). SOURCE_DATE_EPOCH fixes the time stamps in it:
# the same sources give the same wheel, byte for byte.
FROM ${PYTHON_IMAGE} AS wheel
COPY --from=lock /build-requirements.txt /tmp/build-requirements.txt
RUN pip install --no-cache-dir --disable-pip-version-check --no-deps --require-hashes \
      -r /tmp/build-requirements.txt
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY stream_export ./stream_export
COPY topics ./topics
ARG SOURCE_DATE_EPOCH=315532800
RUN pip wheel --no-cache-dir --disable-pip-version-check --no-deps --no-build-isolation \
      --wheel-dir /dist .

FROM ${PYTHON_IMAGE}
RUN useradd --create-home --uid 10001 app
WORKDIR /app
# The locked dependencies first, in a layer of their own: a change to the
# sources does not reinstall them, and every build gets the same versions. The
# byte code is compiled with hashes of the sources, not their time stamps, so it
# too is the same in every build.
COPY --from=lock /requirements.txt /tmp/requirements.txt
RUN pip install --no-cache-dir --disable-pip-version-check --no-compile --no-deps --require-hashes \
      -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt \
    && python -m compileall -q --invalidation-mode unchecked-hash /usr/local/lib/python3.11/site-packages
COPY --from=wheel /dist /tmp/dist
RUN pip install --no-cache-dir --disable-pip-version-check --no-compile --no-deps --no-index \
      /tmp/dist/stream_export-*.whl \
    && rm -r /tmp/dist \
    && python -m compileall -q --invalidation-mode unchecked-hash \
      /usr/local/lib/python3.11/site-packages/stream_export \
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
