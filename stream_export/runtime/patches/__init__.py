"""Every private name of faust-streaming and aiokafka the worker uses, in one place.

Faust has no public API for what the stages need, so this package is the fence:
nothing else in ``stream_export`` touches a private name (ruff's SLF rule), and
:mod:`stream_export.runtime.compat` checks each one before the worker starts.

One module per patched part: the consumer (batches handed whole to the stages,
records lost after a recovery), the producer (retries and bounded stops), the
transport that puts them together, and the tables' private names. The metadata
refresh pacing lives in ``kafka.connection.pace_metadata_refreshes`` (the gateway
paces too).
"""
