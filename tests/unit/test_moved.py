"""The old import paths users wrote keep working, each warning with its new path."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stream_export.contract.decoding import decode_event
from stream_export.contract.events import Step
from stream_export.settings import Settings, load


def test_old_paths_give_the_same_objects_and_name_the_new_ones() -> None:
    with pytest.warns(DeprecationWarning, match="import it from stream_export.settings"):
        from stream_export.config import Settings as OldSettings  # type: ignore[import-untyped]
        from stream_export.config import load as old_load
    assert (OldSettings, old_load) == (Settings, load)
    with pytest.warns(DeprecationWarning) as warned:
        from stream_export.events import Step as OldStep  # type: ignore[import-untyped]
        from stream_export.events import decode_event as old_decode
    assert [str(w.message) for w in warned] == [
        "stream_export.events.Step moved: import it from stream_export.contract.events",
        "stream_export.events.decode_event moved: import it from stream_export.contract.decoding",
    ]
    assert (OldStep, old_decode) == (Step, decode_event)


def test_a_name_the_old_module_no_longer_has_fails_saying_where_to_look() -> None:
    with pytest.raises(ImportError, match=r"stream_export.config moved to stream_export.settings"):
        from stream_export.config import no_such_name  # noqa: F401


def test_the_client_the_recorder_and_the_feed_keep_their_paths() -> None:
    """They never moved: importing them warns of nothing (warnings are errors here)."""
    code = (
        "from stream_export.client import Producer, SyncProducer\n"
        "from stream_export.client.recorder import EpisodeRecorder\n"
        "from stream_export.feed import Feed\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
