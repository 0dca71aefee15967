"""Fixtures of the writer's tests (test_writer.py, test_writer_shared.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from stream_export.output import writer as writer_module
from tests.support.writer_faults import FaultyOs


@pytest.fixture
def faulty(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FaultyOs]:
    """Install a FaultyOs as the writer's ``os``: ``faulty(n)`` fails the n-th call."""

    def install(fail_at: int, error: OSError | None = None, times: int = 1) -> FaultyOs:
        fake = FaultyOs(fail_at, error, times)
        monkeypatch.setattr(writer_module, "os", fake)
        return fake

    return install
