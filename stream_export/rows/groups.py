"""Closed groups -> ``group`` training rows (and the other group outputs, and verl's
parquet rows of ``stream-export export``): pure functions, no I/O.

One row per group, the prompt once and index-aligned lists of its scored
(not truncated) rollouts, the shape ART's ``TrajectoryGroup`` and rLLM / SkyRL
group their trajectories in::

    {"group_id", "prompt", "completions", "episode_ids", "rewards", "advantages",
     "outcomes", "size", "expected_size", "complete", "close_reason", "missing",
     "truncated", "duplicates", "mean", "std", "zero_variance", "estimator", "eps"}

``prompt`` and ``completions`` are text, as the ``text`` format writes them (the
completions without its separator: each is a turn of its own). The rows that pair a
prompt with one continuation (``rollouts``, ``preference``, ``kto``) start that
continuation with ``format.text_separator``, as the text format does: TRL joins them
as they are.
Every column has one type in every row (no nulls), so files load with
``datasets.load_dataset("json", ...)`` without ``features=``: ``expected_size``
and ``missing`` are 0 when the group's size was never announced. A late rollout
(``close_reason`` ``late``) has no group row.

The worker writes them through the sink machinery (checkpoint, manifest, exactly
once) with the prefix ``<sink.prefix>.groups`` (``training-data.groups.jsonl``:
the episodes' glob ``training-data-*.jsonl`` does not take them in).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, Literal

import msgspec

from stream_export.contract.episode import Episode
from stream_export.contract.events import Prompt
from stream_export.contract.groups import GroupRecord, rollout_reward
from stream_export.contract.widths import bounded
from stream_export.rows import formats, tokens
from stream_export.rows.episode import prompt_text
from stream_export.settings.groups import GroupSettings
from stream_export.trainers import verl_reward

Row = dict[str, Any]


def group_row(record: GroupRecord) -> Row | None:
    """The ``group`` row of a closed group (None for a late rollout)."""
    if record.close_reason == "late":
        return None
    kept = scored_rollouts(record)
    completions = [_completion(episode) for episode, _ in kept]
    return {
        "group_id": record.group_id,
        "prompt": prompt_text(record.rollouts[0].prompt),
        "completions": completions,
        "episode_ids": [e.episode_id for e, _ in kept],
        "rewards": [rollout_reward(e) for e, _ in kept],
        "advantages": [a for _, a in kept],
        "outcomes": [e.outcome for e, _ in kept],
        "size": record.size,
        "expected_size": record.expected_size or 0,
        "complete": record.complete,
        "close_reason": record.close_reason,
        "missing": record.missing or 0,
        "truncated": record.truncated,
        "duplicates": record.duplicates,
        "mean": record.mean,
        "std": record.std,
        "zero_variance": record.zero_variance,
        "estimator": record.estimator,
        "eps": record.eps,
    }


def rollout_rows(record: GroupRecord, separator: str) -> list[Row]:
    """One row per scored rollout, annotated with its group (verl's ``uid``
    convention): ``prompt``/``completion`` text plus ``uid``, ``episode_id``,
    ``reward``, ``advantage``, ``outcome``, ``group_size``, ``group_mean``,
    ``group_std``, ``zero_variance``, ``complete`` and ``close_reason``. A late
    rollout comes alone (advantage 0.0, zero_variance true, reason ``late``).

    A rollout with model calls gives one row per token segment instead: the
    ``tokens`` format's arrays (``input_ids``, ``loss_mask``, ``logprobs``,
    ``prompt_len``, ``weight_version_min`` / ``_max``) in place of the text, then
    the same group columns with its ``segment``, and ``stale``."""
    stale = dict(zip((e.episode_id for e in record.rollouts), record.stale, strict=False))
    rows = []
    for episode, advantage in scored_rollouts(record):
        group = _group_columns(record, episode, advantage)
        if episode.tokens is None:
            text = {
                "prompt": prompt_text(episode.prompt),
                "completion": separator + _completion(episode),
            }
            rows.append({**text, **group})
            continue
        flag = stale.get(episode.episode_id, False)
        for i, arrays in enumerate(tokens.segment_arrays(episode)):
            rows.append({**arrays, **group, "segment": i, "stale": flag})
    return rows


def group_token_records(record: GroupRecord) -> list[Row]:
    """The ``tokens`` rows of a closed group's scored rollouts, each with the rollout's
    ``advantage`` (the same on each of its segments): what a trainer taking groups from
    the feed trains on. None for a late rollout."""
    if record.close_reason == "late":
        return []
    return [
        {**row, "advantage": advantage}
        for episode, advantage in scored_rollouts(record)
        for row in tokens.token_records(episode)
    ]


def _group_columns(record: GroupRecord, episode: Episode, advantage: float) -> Row:
    return {
        "uid": record.group_id,
        "episode_id": episode.episode_id,
        "reward": rollout_reward(episode),
        "advantage": advantage,
        "outcome": episode.outcome,
        "group_size": record.size,
        "group_mean": record.mean,
        "group_std": record.std,
        "zero_variance": record.zero_variance,
        "complete": record.complete,
        "close_reason": record.close_reason,
    }


def preference_rows(record: GroupRecord, margin: float, separator: str) -> list[Row]:
    """TRL's DPO preference row of a group: its best rollout ``chosen`` against its
    worst ``rejected``, when their rewards differ by more than ``margin``.

    The rejected side is the worst rollout whose text differs from the chosen one:
    the same completion on both sides (one text scored twice, a noisy reward)
    teaches a DPO trainer nothing."""
    if record.close_reason == "late":
        return []
    ranked = sorted(scored_rollouts(record), key=lambda pair: rollout_reward(pair[0]))
    if len(ranked) < 2:
        return []
    best = ranked[-1][0]
    chosen = _completion(best)
    worst = next((e for e, _ in ranked if _completion(e) != chosen), None)
    if worst is None:
        return []
    high, low = rollout_reward(best), rollout_reward(worst)
    if (spread := bounded(high - low)) <= margin:
        return []
    return [
        {
            "prompt": prompt_text(best.prompt),
            "chosen": separator + chosen,
            "rejected": separator + _completion(worst),
            "group_id": record.group_id,
            "chosen_reward": high,
            "rejected_reward": low,
            "margin": spread,
        }
    ]


def kto_rows(record: GroupRecord, separator: str) -> list[Row]:
    """TRL's KTO rows: ``prompt``/``completion`` and ``label`` true when the rollout
    did better than its group (advantage > 0); none for a zero-variance group."""
    if record.close_reason == "late" or record.zero_variance:
        return []
    return [
        {
            "prompt": prompt_text(episode.prompt),
            "completion": separator + _completion(episode),
            "label": advantage > 0,
            "group_id": record.group_id,
        }
        for episode, advantage in scored_rollouts(record)
    ]


def in_band(pass_rate: float, low: float | None, high: float | None) -> bool:
    """Whether a pass rate lies strictly between the bounds (None: unbounded)."""
    return (low is None or pass_rate > low) and (high is None or pass_rate < high)


def prompt_rows(
    record: GroupRecord, low: float | None = None, high: float | None = None
) -> list[Row]:
    """TRL's prompt-only row of a task: ``prompt`` plus its observed ``pass_rate``
    (share of scored rollouts whose outcome is ``success``) and ``mean_reward``;
    none for a late rollout, a group with no scored rollout, or a pass rate not
    strictly between ``low`` and ``high``."""
    kept = scored_rollouts(record)
    if record.close_reason == "late" or not kept:
        return []
    passed = sum(1 for episode, _ in kept if episode.outcome == "success")
    if not in_band(passed / len(kept), low, high):
        return []
    return [
        {
            "prompt": prompt_text(record.rollouts[0].prompt),
            "group_id": record.group_id,
            "pass_rate": passed / len(kept),
            "mean_reward": record.mean,
            "scored": len(kept),
        }
    ]


#: Metadata keys a verl row takes its ``ground_truth`` from, the first one present.
GROUND_TRUTH_KEYS: Final = ("ground_truth", "answer")


def verl_row(record: GroupRecord, prompt: Row, index: int) -> Row:
    """verl's ``RLHFDataset`` row of a task whose ``prompt_rows`` row is ``prompt``.

    The first rollout's metadata (start merged with end) gives ``data_source`` (its
    ``data_source`` if the agent set one, else ``stream-export/<domain>``, else
    ``stream-export``: never one of verl's own scorer names, which would score the row
    by their rules), ``ability`` (its ``domain``, else ``unknown``) and
    ``reward_model.ground_truth`` (its ``ground_truth``, else its ``answer``, else
    empty). ``extra_info`` adds the scored rollouts' completions and rewards (in
    episode-id order), for :mod:`stream_export.trainers.verl_reward`. Every metadata
    value is text, a non-text one its JSON, so every row has one schema."""
    first = record.rollouts[0]
    meta = first.metadata
    truth = next((meta[k] for k in GROUND_TRUTH_KEYS if meta.get(k) is not None), "")
    domain = _text(meta.get("domain") or "")
    # in episode-id order: the same rollouts, the same row, whatever order they came in
    kept = sorted(scored_rollouts(record), key=lambda pair: pair[0].episode_id)
    return {
        "data_source": _text(meta.get("data_source") or verl_reward.source_for(domain)),
        "prompt": _messages(first.prompt),
        "ability": domain or "unknown",
        "reward_model": {"style": "rule", "ground_truth": _text(truth)},
        "extra_info": {
            "index": index,
            **{k: v for k, v in prompt.items() if k != "prompt"},
            "completions": [_completion(episode) for episode, _ in kept],
            "rewards": [rollout_reward(episode) for episode, _ in kept],
        },
    }


def dropped_for_variance(record: GroupRecord, on: Literal["none", "reward", "outcome"]) -> bool:
    """Whether ``groups.drop_zero_variance`` (``on``) leaves a closed group out: on
    ``reward`` when it is ``zero_variance``, on ``outcome`` when its scored rollouts
    all have one outcome. A late rollout, exported on its own, never is."""
    if on == "none" or record.close_reason == "late":
        return False
    if on == "reward":
        return record.zero_variance
    kept = zip(record.rollouts, record.advantages, strict=True)
    return len({episode.outcome for episode, a in kept if a is not None}) <= 1


def verl_rows(records: Iterable[GroupRecord], settings: GroupSettings) -> list[Row]:
    """The verl rows of closed groups, numbered by ``extra_info.index``: the tasks the
    prompts output keeps (its pass-rate band, ``groups.drop_zero_variance``)."""
    low, high = settings.prompts_min_pass_rate, settings.prompts_max_pass_rate
    kept = [
        (record, row)
        for record in records
        if not dropped_for_variance(record, settings.drop_zero_variance)
        for row in prompt_rows(record, low, high)
    ]
    return [verl_row(record, row, index) for index, (record, row) in enumerate(kept)]


def _messages(prompt: Prompt) -> list[dict[str, str]]:
    """A prompt as chat messages (text is one user turn); ``name`` is left out."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [{"role": m.role, "content": m.content} for m in prompt]


def _text(value: object) -> str:
    return value if isinstance(value, str) else msgspec.json.encode(value).decode()


def scored_rollouts(record: GroupRecord) -> list[tuple[Episode, float]]:
    """The group's scored rollouts (not truncated, not dropped) with their advantages."""
    return [
        (episode, advantage)
        for episode, advantage in zip(record.rollouts, record.advantages, strict=True)
        if advantage is not None
    ]


def _completion(episode: Episode) -> str:
    texts = formats.text_records(episode, False)
    return str(texts[0]["completion"]) if texts else ""
