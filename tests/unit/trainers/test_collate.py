"""The collator's pure part (no torch), on closed groups built by the package's own
groups code and on rows read back from files as the sink writes them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stream_export.errors import TrainerInputError
from stream_export.rows.groups import group_token_records
from stream_export.trainers.collate import call_spans, collate, groups_of, read_rows
from stream_export.trainers.trl_rollouts import FeedRolloutFunc
from tests.support.call_episodes import tool_episode
from tests.support.group_records import record

MASK = [0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1]


def closed_group(versions: tuple[Any, Any] = (3, 4)) -> Any:
    rollouts = [
        tool_episode("a", group_id="g", reward=1.0, versions=versions),
        tool_episode("b", group_id="g", reward=0.0, versions=versions, offset=5),
    ]
    return msgspec.structs.replace(record(rollouts, 2, estimator="grpo"), group_id="g")


def test_a_closed_group_collates_padded_with_its_advantages_and_versions() -> None:
    group = closed_group()
    short = {**group_token_records(group)[0], "episode_id": "short"}
    short.update(input_ids=short["input_ids"][:7], loss_mask=MASK[:7])
    short.update(logprobs=short["logprobs"][:7], call_starts=[4], call_ends=[7])
    short["call_weight_versions"] = [3]
    got = collate([group, short], pad_id=99)
    a, b = group.advantages
    assert got["episode_ids"] == ["a", "b", "short"] and got["group_ids"] == ["g"] * 3
    assert got["input_ids"][2] == [1, 2, 3, 4, 10, 11, 12] + [99] * 5
    assert got["attention_mask"][2] == [1] * 7 + [0] * 5
    assert got["position_ids"][0] == list(range(12))
    assert got["position_ids"][2] == [*range(7), 0, 0, 0, 0, 0]
    assert got["loss_mask"][:2] == [MASK, MASK]
    assert got["advantages"][1] == [b * m for m in MASK] and a > 0 > b
    assert got["weight_versions"][0] == [-1] * 4 + [3] * 3 + [-1] * 3 + [4] * 2
    assert got["old_logprobs"][0][4:7] == [-0.25, -0.5, -0.75]
    assert got["rewards"] == [1.0, 0.0, 1.0] and got["truncated"] == [False] * 3


def test_truncation_cuts_masks_logprobs_and_versions_together() -> None:
    got = collate([closed_group()], max_length=9)
    assert got["truncated"] == [True, True]
    for key in ("input_ids", "loss_mask", "old_logprobs", "advantages", "weight_versions"):
        assert {len(row) for row in got[key]} == {9}
    assert got["loss_mask"][0] == MASK[:9]
    assert got["weight_versions"][0] == [-1] * 4 + [3] * 3 + [-1] * 2
    # nothing sampled within the first 4 tokens: nothing to train on, no row
    assert collate([closed_group()], max_length=4)["input_ids"] == []


def test_rows_written_before_the_call_columns_read_calls_from_the_mask() -> None:
    [old, _] = group_token_records(closed_group(versions=(7, 7)))
    for key in ("call_starts", "call_ends", "call_weight_versions"):
        del old[key]
    assert call_spans(old) == [(4, 7, 7), (10, 12, 7)]
    assert call_spans({**old, "weight_version_max": 8}) == [(4, 7, -1), (10, 12, -1)]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"input_ids": None}, "no token ids"),
        ({"logprobs": [0.0]}, "differ in length"),
        ({"advantage": None}, "no advantage"),
    ],
)
def test_rows_it_cannot_train_on_raise(change: dict[str, Any], message: str) -> None:
    row = {**group_token_records(closed_group())[0], **change}
    with pytest.raises(TrainerInputError, match=message):
        collate([row])


def test_files_read_back_as_the_sink_writes_them(tmp_path: Path) -> None:
    rows = group_token_records(closed_group(versions=("3", "x")))
    jsonl = tmp_path / "a.jsonl.gz"
    with gzip.open(jsonl, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    parquet = tmp_path / "b.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    read = list(read_rows([jsonl, parquet]))
    assert read == rows + rows
    got = collate(groups_of(read))
    assert got["weight_versions"][0][4:12] == [3, 3, 3, -1, -1, -1, -1, -1]


class Held:
    def __init__(self, items: list[Any]) -> None:
        self.items, self.acked = items, 0

    def ack(self) -> None:
        self.acked += 1


def test_trls_rollout_func_skips_groups_of_the_wrong_size_and_acks_a_call_late() -> None:
    rows = group_token_records(closed_group())
    feed = [Held([rows[:1], rows]), Held([]), Held([rows])]
    func = FeedRolloutFunc(feed, num_generations=2)
    first = func(["p", "p"])
    assert first["prompt_ids"] == [[1, 2, 3, 4], [6, 2, 3, 4]]
    assert first["env_mask"][0] == MASK[4:] and first["reward"] == [1.0, 0.0]
    assert func.skipped == {"size": 1}
    assert [b.acked for b in feed] == [0, 0, 0]
    func(["p", "p"])  # TRL stepped on the first call's rollouts: their batch is acked
    assert [b.acked for b in feed] == [1, 0, 0]  # the empty one was passed in this call
    func.ack()
    assert [b.acked for b in feed] == [1, 1, 1]
