"""Episode -> GRPO record(s). Pure functions, no I/O (walking skeleton: text only).

The sink depends only on ``build``: a callable that turns one episode into the
encoded JSON lines to write (no trailing newline), an empty list when a filter
drops it, or raises FormatError.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from stream_export.config import FormatSettings
from stream_export.events import Episode
from stream_export.metrics import Metrics

Formatter = Callable[[Episode], list[bytes]]


def text_record(episode: Episode) -> dict[str, Any]:
    """The seed's format: prompt text, and reasoning with explicit Action: lines."""
    prompt = (
        episode.prompt
        if isinstance(episode.prompt, str)
        else "\n".join(m.content for m in episode.prompt)
    )
    parts = [f"Action: {s.content}" if s.kind == "action" else s.content for s in episode.steps]
    return {"prompt": prompt, "completion": "\n\n".join(parts)}


def build(settings: FormatSettings, metrics: Metrics) -> Formatter:
    encoder = msgspec.json.Encoder()

    def format_episode(episode: Episode) -> list[bytes]:
        return [encoder.encode(text_record(episode))]

    return format_episode
