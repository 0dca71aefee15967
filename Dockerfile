# The stream-export worker image (also runs the demo agents and the CLI).
FROM python:3.11-slim-bookworm
RUN useradd --create-home --uid 10001 app
WORKDIR /app
COPY pyproject.toml README.md ./
COPY stream_export ./stream_export
COPY topics ./topics
RUN pip install --no-cache-dir . && mkdir -p /data /state && chown app:app /data /state
USER 10001
ENV STREAM_EXPORT_SINK_OUTPUT_DIR=/data \
    STREAM_EXPORT_WORKER_DATA_DIR=/state \
    STREAM_EXPORT_HTTP_HOST=0.0.0.0
EXPOSE 9108
ENTRYPOINT ["stream-export"]
CMD ["worker"]
