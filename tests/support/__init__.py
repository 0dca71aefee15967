"""What the tests share and the benchmarks reuse: traffic with its expected verdicts,
producers and readers of topics, worker processes, waits, and the deploy files'
helpers. Tests import only from here and ``stream_export``, never from ``bench`` or
another test module (tests/unit/test_test_imports.py)."""
