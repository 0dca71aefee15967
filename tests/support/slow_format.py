"""A custom formatter (``format.format=tests.support.slow_format:record``) that
holds the worker's event loop for the episode's ``block_s`` metadata seconds, as a
stuck synchronous call in the pipeline would."""

from __future__ import annotations

import time
from typing import Any

from stream_export.contract.episode import Episode


def record(episode: Episode) -> dict[str, Any]:
    block = episode.metadata.get("block_s")
    if isinstance(block, int | float):
        time.sleep(block)
    return {"prompt": episode.prompt}
