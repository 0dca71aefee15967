"""The ``tokens`` rows of an episode's model calls (its ``llm_call`` steps): pure,
no I/O.

``tokens`` rows, one per token segment, are what token-level RL trainers take as
they are: ``input_ids`` (every token of the run), ``loss_mask`` (1 exactly on the
tokens a call sampled), ``logprobs`` aligned with ``input_ids`` (0.0 where the mask
is 0), ``prompt_len`` (the tokens before the first sampled one: verl's
``prompt_ids`` / ``response_ids`` split) and, per call of the segment, where its
completion sits and the version that served it (``call_starts``, ``call_ends``,
``call_weight_versions``: ART's ``Choice`` objects, one per call, are cut there).
The rows of a closed group's rollouts (``rows.groups.group_token_records``) add
the rollout's ``advantage``.

Their columns, and their types, are declared in :mod:`.columns`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from stream_export.contract.calls import WeightVersion, version_key
from stream_export.contract.episode import Episode
from stream_export.rows.columns import FORMATS
from stream_export.rows.episode import Record

#: The columns of a ``tokens`` row, in order (metadata columns follow).
TOKEN_COLUMNS: Final = tuple(name for name, _ in FORMATS["tokens"])


def segment_arrays(episode: Episode) -> list[Record]:
    """Per token segment: its ``input_ids``, ``loss_mask``, aligned ``logprobs``,
    ``prompt_len``, ``weight_version_min`` / ``_max`` and its calls' spans."""
    if episode.tokens is None:
        return []
    rows = []
    for seg in episode.tokens.segments:
        rows.append(
            {
                "input_ids": seg.input_ids,
                "loss_mask": seg.loss_mask(),
                "logprobs": seg.aligned_logprobs(),
                "prompt_len": seg.calls[0].start if seg.calls else len(seg.input_ids),
                "weight_version_min": seg.weight_version_min,
                "weight_version_max": seg.weight_version_max,
                "call_starts": [call.start for call in seg.calls],
                "call_ends": [call.end for call in seg.calls],
                "call_weight_versions": one_type([call.weight_version for call in seg.calls]),
            }
        )
    return rows


def one_type(versions: list[WeightVersion]) -> list[WeightVersion]:
    """A list of versions of one type, as JSON readers (Arrow, ``datasets``) need:
    as sent, unless the calls mixed integers and strings, then all as strings."""
    if len({type(v) for v in versions if v is not None}) > 1:
        return [None if v is None else str(v) for v in versions]
    return versions


def token_records(episode: Episode) -> list[Record]:
    """The ``tokens`` rows of an episode (none without calls)."""
    return [
        {
            **arrays,
            "episode_id": episode.episode_id,
            "segment": i,
            "reward": episode.reward,
            "outcome": episode.outcome,
            "group_id": episode.group_id or "",
        }
        for i, arrays in enumerate(segment_arrays(episode))
    ]


def weight_range(episodes: Iterable[Episode]) -> tuple[WeightVersion, WeightVersion] | None:
    """The weight versions of the episodes' calls, lowest and highest (None: no call)."""
    lows: list[WeightVersion] = []
    highs: list[WeightVersion] = []
    for e in episodes:
        tokens = e.tokens
        if tokens is not None and tokens.weight_version_min is not None:
            lows.append(tokens.weight_version_min)
            highs.append(tokens.weight_version_max or tokens.weight_version_min)
    if not lows:
        return None
    return min(lows, key=version_key), max(highs, key=version_key)


# -- messages -------------------------------------------------------------------
