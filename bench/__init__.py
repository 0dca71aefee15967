"""The benchmarks (never in CI): ``python -m bench`` and its ``bench.<name>`` siblings.

Their results go through :mod:`bench.report`; what they run and how a run is
measured are in :mod:`bench.systems`, :mod:`bench.runs` and :mod:`bench.harness`.
"""

from __future__ import annotations

from stream_export.errors import StreamExportError


class BenchError(StreamExportError):
    """A benchmark could not measure something (a system failed or timed out)."""

    reason = "bench"
