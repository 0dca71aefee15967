"""The golden episodes (tests/golden/), the golden files' format cases, and formatting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stream_export.contract.decoding import decode_episode
from stream_export.contract.episode import Episode
from stream_export.output.formatter import build
from stream_export.runtime.metrics import Metrics
from stream_export.settings.format import FormatSettings

GOLDEN = Path(__file__).resolve().parent.parent / "golden"


def golden_episodes() -> list[Episode]:
    return [decode_episode(line) for line in (GOLDEN / "episodes.jsonl").read_bytes().splitlines()]


def by_id(episode_id: str) -> Episode:
    return next(e for e in golden_episodes() if e.episode_id == episode_id)


def run(episodes: list[Episode], metrics: Metrics | None = None, **settings: Any) -> list[bytes]:
    """Format with ``settings``; metadata columns unless a case says otherwise, since
    most cases check metadata handling (the product default is no metadata)."""
    settings.setdefault("metadata_mode", "columns")
    formatter = build(FormatSettings(**settings), metrics or Metrics())
    return [line for episode in episodes for line in formatter(episode)]


def filtered(metrics: Metrics, reason: str) -> float:
    value = metrics.registry.get_sample_value(
        "stream_export_episodes_filtered_total", {"reason": reason}
    )
    return value or 0.0


GOLDEN_CASES: dict[str, dict[str, Any]] = {
    "text-episode": {},
    "text-step": {"granularity": "step"},
    "conversational-episode": {"format": "conversational"},
    "conversational-step": {"format": "conversational", "granularity": "step"},
    "conversational-step-nested": {
        "format": "conversational",
        "granularity": "step",
        "metadata_mode": "nested",
    },
    "messages-episode": {"format": "messages"},
    "episode-episode": {"format": "episode"},
    "episode-step": {"format": "episode", "granularity": "step"},
}


def is_trl_conversational(value: Any) -> bool:
    """TRL's check: a list whose first item is a dict with "role" and "content"."""
    return (
        isinstance(value, list)
        and bool(value)
        and isinstance(value[0], dict)
        and {"role", "content"} <= value[0].keys()
    )
