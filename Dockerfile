# The stream-export worker image (also runs the demo agents and the CLI).
# Runs as uid 10001 and writes only to /data (output) and /state (table store),
# so it works with a read-only root file system (the Helm chart sets one). No
# HEALTHCHECK here: the same image runs the demo agents, which serve no HTTP;
# docker-compose.yml and the chart probe the worker's /healthz and /readyz.
FROM python:3.11-slim-bookworm
RUN useradd --create-home --uid 10001 app
WORKDIR /app
COPY pyproject.toml README.md ./
COPY stream_export ./stream_export
COPY topics ./topics
RUN pip install --no-cache-dir . && mkdir -p /data /state && chown app:app /data /state
USER 10001
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    STREAM_EXPORT_SINK_OUTPUT_DIR=/data \
    STREAM_EXPORT_WORKER_DATA_DIR=/state \
    STREAM_EXPORT_HTTP_HOST=0.0.0.0
EXPOSE 9108
ENTRYPOINT ["stream-export"]
CMD ["worker"]
