"""Episode -> GRPO record(s). Pure functions, no I/O (walking skeleton: text only)."""

from __future__ import annotations

from typing import Any

from stream_export.events import Episode


def text_record(episode: Episode) -> dict[str, Any]:
    """The seed's format: prompt text, and reasoning with explicit Action: lines."""
    prompt = (
        episode.prompt
        if isinstance(episode.prompt, str)
        else "\n".join(m.content for m in episode.prompt)
    )
    lines = []
    for step in episode.steps:
        if step.kind == "action":
            lines.append(f"Action: {step.content}")
        else:
            lines.append(step.content)
    return {"prompt": prompt, "completion": "\n\n".join(lines)}
