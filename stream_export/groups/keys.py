"""Which group an episode belongs to, and the digest that tells two tasks under one
group id apart (pure)."""

from __future__ import annotations

import hashlib
from typing import Literal

import msgspec

from stream_export.contract.episode import Episode
from stream_export.contract.events import Prompt


def normalised_prompt(prompt: Prompt) -> bytes:
    """The prompt with white space trimmed and collapsed (chat messages keep their
    roles), as the bytes ``prompt_hash`` hashes."""
    if isinstance(prompt, str):
        return " ".join(prompt.split()).encode()
    return msgspec.json.encode([[m.role, " ".join(m.content.split())] for m in prompt])


def prompt_digest(prompt: Prompt) -> str:
    """A short digest of the normalised prompt, to tell two tasks under one group id."""
    return hashlib.sha256(normalised_prompt(prompt)).hexdigest()[:32]


def group_key(episode: Episode, fallback: Literal["none", "prompt_hash"]) -> str | None:
    """The group an episode belongs to: its group_id, else by ``fallback`` the hash
    of its normalised prompt (``prompt:`` and 32 hex digits of SHA-256) or none."""
    if episode.group_id is not None:
        return episode.group_id
    if fallback == "none":
        return None
    return "prompt:" + prompt_digest(episode.prompt)
