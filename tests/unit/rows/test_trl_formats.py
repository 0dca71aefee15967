"""The preference and KTO rows pass TRL's own dataset-format checks (``trl.data_utils``,
which imports without torch): standard (not conversational) rows, with an explicit
prompt that ``extract_prompt`` leaves as it is."""

from __future__ import annotations

import importlib

from trl.data_utils import (
    is_conversational,
    maybe_extract_prompt,
    maybe_unpair_preference_dataset,
    unpair_preference_dataset,
)

from stream_export.rows.groups import kto_rows, preference_rows
from tests.support.group_records import SEP, record, rollout


def test_preference_rows_are_standard_explicit_prompt_rows_for_trl() -> None:
    [pair] = preference_rows(record([rollout("a", 1.0), rollout("b", 0.0)], 2), 0.0, SEP)
    assert not is_conversational(pair)
    assert maybe_extract_prompt(pair) == pair  # the prompt is already apart
    # unpair maps batched and keeps other columns, so it takes the trainer's three
    datasets = importlib.import_module("datasets")
    ds = datasets.Dataset.from_list([{k: pair[k] for k in ("prompt", "chosen", "rejected")}])
    unpaired = maybe_unpair_preference_dataset(ds)
    assert sorted(unpaired["label"]) == [False, True]
    assert set(unpaired["completion"]) == {"\n\nanswer a", "\n\nanswer b"}


def test_kto_rows_are_standard_unpaired_rows_for_trl() -> None:
    rows = kto_rows(record([rollout("a", 1.0), rollout("b", 0.0)], 2), SEP)
    assert rows and not any(is_conversational(r) for r in rows)
    assert all({"prompt", "completion", "label"} <= r.keys() for r in rows)
    assert all(maybe_extract_prompt(r) == r for r in rows)


def test_the_readme_unpair_line_runs_on_preference_files_rows() -> None:
    """The README's adapter line for the preference output, on whole rows (with the
    group columns), as a dataset loaded from the files holds them."""
    rows = preference_rows(record([rollout("a", 1.0), rollout("b", 0.0)], 2), 0.0, SEP)
    ds = importlib.import_module("datasets").Dataset.from_list(rows)
    assert {"group_id", "margin"} <= set(ds.column_names)
    unpaired = unpair_preference_dataset(ds.select_columns(["prompt", "chosen", "rejected"]))
    assert sorted(zip(unpaired["completion"], unpaired["label"], strict=True)) == [
        ("\n\nanswer a", True),
        ("\n\nanswer b", False),
    ]
