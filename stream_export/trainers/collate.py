"""The collator: feed batches, or files of ``tokens`` / group rows, -> padded arrays a
trainer steps on.

``collate(items)`` gives plain lists (standard library only: the worker never needs
torch, and neither does this), ``to_tensors`` the same as torch tensors::

    {"input_ids", "attention_mask", "position_ids", "loss_mask",      # [B, T]
     "old_logprobs", "advantages", "weight_versions",                 # [B, T]
     "group_ids", "episode_ids", "rewards", "truncated"}              # [B], lists

An item is a row (a ``tokens`` row with an ``advantage``: a closed group's, see
``rows.groups.group_token_records``, or a row of the ``rollouts`` group output), a
closed group as the feed's ``groups`` source delivers it (a ``GroupRecord``), or a
list of rows (one group). Sequences are right-padded. ``advantages`` is the rollout's
advantage on each token it sampled (0 elsewhere); ``weight_versions`` the version of
the call that sampled each token (-1 elsewhere, and where a version is not an
integer). Rows written before ``call_starts`` existed read their calls from the runs
of 1s in ``loss_mask`` (one version for the run when the row's min equals its max).
``max_length`` cuts a sequence's tail: its masks, logprobs and versions are cut with
it, and a sequence with no sampled token left is dropped (it would train nothing).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from stream_export.errors import TrainerInputError

if TYPE_CHECKING:
    import torch

Row = Mapping[str, Any]
#: Per-token columns, [B, T], and the value padding takes in each.
PADDED: Final = {
    "input_ids": 0,
    "attention_mask": 0,
    "position_ids": 0,
    "loss_mask": 0,
    "old_logprobs": 0.0,
    "advantages": 0.0,
    "weight_versions": -1,
}
_FLOATS: Final = frozenset({"old_logprobs", "advantages"})


def version_number(version: object) -> int:
    """A weight version as an integer (-1: none, or not one that spells an integer)."""
    if isinstance(version, bool) or version is None:
        return -1
    if isinstance(version, int):
        return version
    text = str(version).strip()
    return int(text) if text.lstrip("-").isdigit() else -1


def call_spans(row: Row) -> list[tuple[int, int, int]]:
    """Each call's ``(start, end, version)`` in the row's ``input_ids``."""
    if row.get("call_starts") is not None:
        starts, ends = row["call_starts"], row["call_ends"]
        versions = row.get("call_weight_versions") or [None] * len(starts)
        if not len(starts) == len(ends) == len(versions):
            raise TrainerInputError("call_starts, call_ends and call_weight_versions differ")
        return [(s, e, version_number(v)) for s, e, v in zip(starts, ends, versions, strict=True)]
    low, high = row.get("weight_version_min"), row.get("weight_version_max")
    version = version_number(low) if low == high else -1
    spans, start = [], None
    for i, bit in enumerate([*row["loss_mask"], 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            spans.append((start, i, version))
            start = None
    return spans


@dataclass(frozen=True)
class Trainable:
    """One row, checked and cut to ``max_length``."""

    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]
    advantage: float
    group_id: str
    episode_id: str
    reward: float | None
    truncated: bool


def sequence(row: Row, max_length: int | None = None) -> Trainable:
    """A row as a training sequence (see the module's description)."""
    if not row.get("input_ids"):
        raise TrainerInputError(
            f"row of episode {row.get('episode_id')!r} has no token ids (a text rollout): "
            "only rollouts recorded with their model calls train token by token"
        )
    ids, mask, logprobs = list(row["input_ids"]), list(row["loss_mask"]), list(row["logprobs"])
    if not len(ids) == len(mask) == len(logprobs):
        raise TrainerInputError(
            f"row of episode {row.get('episode_id')!r}: input_ids, loss_mask and logprobs "
            f"differ in length ({len(ids)}, {len(mask)}, {len(logprobs)})"
        )
    if row.get("advantage") is None:
        raise TrainerInputError(
            f"row of episode {row.get('episode_id')!r} has no advantage: take closed groups "
            "(the feed's groups source, or the rollouts group output), not episodes"
        )
    versions = [-1] * len(ids)
    for start, end, version in call_spans(row):
        versions[start:end] = [version] * (end - start)
    cut = max_length is not None and len(ids) > max_length
    end = max_length if cut and max_length is not None else len(ids)
    return Trainable(
        input_ids=ids[:end],
        loss_mask=mask[:end],
        logprobs=logprobs[:end],
        versions=versions[:end],
        advantage=float(row["advantage"]),
        group_id=str(row.get("group_id") or row.get("uid") or ""),
        episode_id=str(row.get("episode_id", "")),
        reward=row.get("reward"),
        truncated=cut,
    )


def rows_of(item: Any) -> list[Row]:
    """The rows of one feed item or file row (see the module's description)."""
    if isinstance(item, Mapping):
        return [item]
    if isinstance(item, list):
        return item
    from stream_export.contract.groups import GroupRecord  # needs msgspec: on use only
    from stream_export.rows.groups import group_token_records

    if isinstance(item, GroupRecord):
        return [*group_token_records(item)]
    raise TrainerInputError(f"cannot train on a {type(item).__name__}: give rows or groups")


def collate(
    items: Iterable[Any], *, max_length: int | None = None, pad_id: int = 0
) -> dict[str, list[Any]]:
    """Padded lists of ``items`` (see the module's description)."""
    seqs = [sequence(row, max_length) for item in items for row in rows_of(item)]
    seqs = [s for s in seqs if any(s.loss_mask)]
    width = max((len(s.input_ids) for s in seqs), default=0)
    out: dict[str, list[Any]] = {name: [] for name in PADDED}
    for s in seqs:
        n, pad = len(s.input_ids), width - len(s.input_ids)
        columns: dict[str, list[Any]] = {
            "input_ids": s.input_ids + [pad_id] * pad,
            "attention_mask": [1] * n,
            "position_ids": list(range(n)),
            "loss_mask": s.loss_mask,
            "old_logprobs": s.logprobs,
            "advantages": [s.advantage if m else 0.0 for m in s.loss_mask],
            "weight_versions": s.versions,
        }
        for name, values in columns.items():
            out[name].append(values + [PADDED[name]] * (width - len(values)))
    out["group_ids"] = [s.group_id for s in seqs]
    out["episode_ids"] = [s.episode_id for s in seqs]
    out["rewards"] = [s.reward for s in seqs]
    out["truncated"] = [s.truncated for s in seqs]
    return out


def to_tensors(batch: Mapping[str, list[Any]]) -> dict[str, Any]:
    """``collate``'s per-token columns as torch tensors (int64, float32), the rest as
    they are. Imports torch (the ``trainers`` extra)."""
    import torch

    out: dict[str, Any] = dict(batch)
    for name in PADDED:
        dtype = torch.float32 if name in _FLOATS else torch.int64
        out[name] = torch.tensor(batch[name], dtype=dtype).reshape(len(batch[name]), -1)
    return out


@dataclass(frozen=True)
class Collator:
    """``collate`` then ``to_tensors``: a torch ``DataLoader``'s ``collate_fn``."""

    max_length: int | None = None
    pad_id: int = 0

    def __call__(self, items: Sequence[Any]) -> dict[str, torch.Tensor | list[Any]]:
        return to_tensors(collate(items, max_length=self.max_length, pad_id=self.pad_id))


def read_rows(paths: Iterable[str | Path]) -> Iterator[dict[str, Any]]:
    """The rows of ``tokens`` or ``rollouts`` files as the sink writes them: JSON
    lines (``.gz`` too) or Parquet (needs pyarrow)."""
    for path in map(Path, paths):
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            yield from pq.read_table(path).to_pylist()
            continue
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as fh:
            yield from (json.loads(line) for line in fh if line.strip())


def groups_of(rows: Iterable[Row]) -> list[list[Row]]:
    """Rows bundled by group (``group_id``, or ``uid`` in the rollouts output), in the
    order each group first appears."""
    bundled: dict[str, list[Row]] = {}
    for row in rows:
        bundled.setdefault(str(row.get("group_id") or row.get("uid") or ""), []).append(row)
    return list(bundled.values())
