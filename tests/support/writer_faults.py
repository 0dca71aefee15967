"""Crashing the writer at a chosen file-system call, and what kill -9 leaves."""

from __future__ import annotations

import os
import types
from typing import Any

from stream_export.output.writer import Writer
from tests.support.sinkfiles import record

_FS_CALLS = ("pwrite", "write", "replace", "truncate", "ftruncate", "fsync", "unlink")


class Crash(BaseException):
    """Stands for kill -9: nothing after it runs, no cleanup, no flush."""


class FaultyOs(types.SimpleNamespace):
    """The os module, except that the n-th file-system call fails.

    A failing pwrite writes half of its data first (a torn line on disk). ``error``
    None raises Crash; otherwise that OSError, ``times`` times.
    """

    def __init__(self, fail_at: int, error: OSError | None = None, times: int = 1) -> None:
        super().__init__()
        self.calls = 0
        self.fail_at, self.error, self.times = fail_at, error, times

    def __getattr__(self, name: str) -> Any:
        real = getattr(os, name)
        if name not in _FS_CALLS:
            return real

        def call(*args: Any) -> Any:
            self.calls += 1
            if self.calls >= self.fail_at and self.times > 0:
                self.times -= 1
                if name == "pwrite":
                    fd, data, pos = args
                    os.pwrite(fd, bytes(data[: len(data) // 2]), pos)
                if self.error is None:
                    raise Crash(name)
                raise self.error
            return real(*args)

        return call


def abandon(w: Writer) -> None:
    """What kill -9 leaves: open descriptors closed by the kernel, the lock released."""
    for f in w._files.values():
        if f.fd is not None:
            os.close(f.fd)
    if w._seen.fd is not None:
        os.close(w._seen.fd)
    os.close(w._lock_fd)


def produce(w: Writer, start: int, total: int, flush_every: int = 3) -> None:
    """Like the sink: source offsets 0..total-1 on partition 0, from ``start``."""
    for i in range(start, total):
        w.append(f"e{i}", [record(i)], partition=0, offset=i, event_time=float(i))
        if i % flush_every == 0:
            w.flush()
    w.flush()


def resume_at(w: Writer) -> int:
    return w.offsets.get(0, -1) + 1


def crash_mid_seal(w: Writer, folder: str) -> None:
    """What kill -9 leaves after step 2 of a seal of ``folder``'s active file (its
    seal pending in the checkpoint on disk, nothing moved yet)."""
    w.flush()
    f = w._files[folder]
    f.reset(w._sealing.pend(w._ckpt, f.state, f.hasher, "records", fsync=os.fsync))
    w._save_checkpoint(durable=True)
    abandon(w)
