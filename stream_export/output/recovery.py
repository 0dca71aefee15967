"""What a writer finds on disk at start, put back to its checkpoint: an active file
cut to its checkpointed length (a power loss may have cut it shorter: then to its
last whole line), interrupted compressions removed, and an active file that no
checkpoint names (an older version's output, or a deleted checkpoint) described so
that it can be sealed as it is instead of overwritten.

The writer (writer.py) decides what to do with each; nothing here seals or writes
a checkpoint.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from stream_export.output.durable import chunks, sha256_file
from stream_export.output.layout import ActiveFile
from stream_export.runtime.metrics import Metrics

log = logging.getLogger(__name__)


def cut_to_checkpoint(path: Path, state: ActiveFile, metrics: Metrics) -> Any:
    """Truncate an active file to its checkpointed length (the records after it are
    consumed and written again); a file shorter than that lost its unsynced tail
    (only after a power loss with fsync != "flush"): cut it to its last whole line
    and correct ``state``. Returns a SHA-256 hasher fed with what is kept."""
    size = path.stat().st_size if path.exists() else 0
    if size > state.length:
        os.truncate(path, state.length)
    elif size < state.length:
        metrics.sink_errors.labels("short_file").inc()
        log.error("%s is %d bytes, checkpoint says %d: tail lost", path, size, state.length)
        with path.open("rb") as fh:
            data = fh.read()
        state.length = data.rfind(b"\n") + 1
        state.records = data.count(b"\n", 0, state.length)
        os.truncate(path, state.length)
    return sha256_file(path) if state.length else None


def remove_interrupted_compressions(root: Path, prefix: str) -> None:
    """Delete compressions that crashed before their seal was checkpointed."""
    for tmp in root.glob(f"**/{prefix}-*.tmp"):
        if tmp.is_file():
            tmp.unlink()


def unclaimed_active_file(root: Path, prefix: str, seq: int) -> ActiveFile | None:
    """The active file no checkpoint names, as it is (``seq`` its sequence number),
    or None when there is none or it is empty."""
    path = root / f"{prefix}.jsonl"
    if not path.exists() or not path.stat().st_size:
        return None
    with path.open("rb") as fh:
        records = sum(chunk.count(b"\n") for chunk in chunks(fh))
    info = path.stat()
    return ActiveFile(
        seq=seq, path=path.name, length=info.st_size, records=records, opened=info.st_mtime
    )
