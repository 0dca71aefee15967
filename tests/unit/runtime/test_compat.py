"""The start-up self-check of the private Faust and aiokafka names the worker needs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from importlib.metadata import version
from pathlib import Path

import pytest

from stream_export.runtime import compat
from tests.support.monitoring import free_port


def test_the_installed_versions_have_every_name_the_worker_needs() -> None:
    compat.check()
    assert all(name.problem() is None for name in compat.NAMES)
    assert "faust-streaming<0.16" in compat.tested() and "aiokafka<0.15" in compat.tested()


#: What an upgrade could do to a name, done to the installed package before the
#: real CLI starts the worker.
CHANGES = {
    "missing method": (
        "import faust.tables.base as m; del m.Collection._maybe_set_key_ttl",
        "faust.tables.base.Collection._maybe_set_key_ttl is missing",
    ),
    "changed signature": (
        "import faust.tables.base as m; m.Collection._maybe_del_key_ttl = lambda self, key: None",
        "faust.tables.base.Collection._maybe_del_key_ttl takes (key), not (key, partition)",
    ),
    "attribute no longer set": (
        "import aiokafka as m; m.AIOKafkaProducer.__init__ = lambda self, **kw: None",
        "aiokafka.AIOKafkaProducer.__init__ no longer sets _closed",
    ),
    "missing module attribute": (
        "import faust.streams as m; del m._current_event",
        "faust.streams._current_event is missing",
    ),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_missing_or_changed_name_stops_the_worker_with_one_line(
    change: str, tmp_path: Path
) -> None:
    patch, expected = CHANGES[change]
    script = textwrap.dedent(
        f"""
        import sys
        {patch}
        from stream_export.cli import main
        sys.exit(main(sys.argv[1:]))
        """
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script, "worker", "--bootstrap-servers",
         f"127.0.0.1:{free_port()}", "--set", f"sink.output_dir={tmp_path / 'out'}",
         "--set", f"worker.data_dir={tmp_path / 'state'}"],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    (line,) = lines
    assert line.startswith("stream-export: incompatible_dependency: installed ")
    assert f"faust-streaming {version('faust-streaming')}" in line
    assert f"aiokafka {version('aiokafka')}" in line
    assert expected in line and "tested with" in line
    assert "kafka_unavailable" not in line  # stopped before any Kafka contact
    assert not (tmp_path / "out").exists()
    assert time.monotonic() - started < 30
