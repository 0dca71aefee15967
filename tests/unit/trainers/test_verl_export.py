"""The verl parquet as verl reads it, scored by the shipped reward function as verl's
reward manager calls it: the demo fleet's groups -> rows -> a parquet file ->
``datasets.load_dataset("parquet")`` (verl's ``RLHFDataset``) -> ``compute_score`` by
keyword, with the ``extra_info`` verl's ``naive`` reward manager passes (verl 0.9.1,
``verl/experimental/reward_loop/reward_manager/naive.py``)."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stream_export.errors import RewardError, StreamExportError
from stream_export.rows.groups import verl_rows
from stream_export.rows.schema import verl_schema
from stream_export.settings.groups import GroupSettings
from stream_export.trainers import verl_reward
from stream_export.trainers.verl_reward import compute_score, matches, source_for
from tests.support.group_records import demo_groups
from tests.support.hf_datasets import load_json

__all__ = ["load_json"]  # the fixture, shared

#: Every data_source verl 0.9.1's ``default_compute_score`` has a scorer for
#: (``verl/utils/reward_score/__init__.py``); it also takes any name starting with
#: ``aime``, and raises NotImplementedError for the rest.
VERL_SCORERS = frozenset(
    {
        "openai/gsm8k",
        "lighteval/MATH",
        "DigitalLearningGmbH/MATH-lighteval",
        "HuggingFaceH4/MATH-500",
        "math_dapo",
        "math",
        "math_dapo_reasoning",
        "numina_aops_forum",
        "numina_synthetic_math",
        "numina_amc_aime",
        "numina_synthetic_amc",
        "numina_cn_k12",
        "numina_olympiads",
        "codecontests",
        "apps",
        "codeforces",
        "taco",
        "hiyouga/geometry3k",
        "searchR1_nq",
        "searchR1_triviaqa",
        "searchR1_popqa",
        "searchR1_hotpotqa",
        "searchR1_2wikimultihopqa",
        "searchR1_musique",
        "searchR1_bamboogle",
    }
)


def verl_has_a_scorer_for(source: str) -> bool:
    return source in VERL_SCORERS or source.startswith("aime")


@pytest.fixture(scope="module")
def verl_dataset(load_json: Any, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The demo's rows written as ``export`` writes them, read back as verl reads them."""
    rows = verl_rows(demo_groups(12), GroupSettings())
    path = tmp_path_factory.mktemp("verl") / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=verl_schema()), path)
    dataset: list[dict[str, Any]] = list(load_json([path], "parquet"))
    assert dataset == rows
    return dataset


def score(row: dict[str, Any], response: str) -> Any:
    """``compute_score`` called as verl's naive reward manager calls it."""
    extra_info = {**row["extra_info"], "num_turns": None, "rollout_reward_scores": {}}
    return compute_score(
        data_source=row["data_source"],
        solution_str=response,
        ground_truth=row["reward_model"]["ground_truth"],
        extra_info=extra_info,
    )


def test_the_demos_rows_never_name_one_of_verls_scorers(verl_dataset: list[dict[str, Any]]) -> None:
    sources = {row["data_source"] for row in verl_dataset}
    assert sources == {"stream-export/math", "stream-export/text-adventure"}
    assert not any(verl_has_a_scorer_for(source) for source in sources)


@pytest.mark.parametrize("domain", ["", "math", "openai/gsm8k", "aime24", "math_dapo", "apps"])
def test_our_data_source_is_never_a_verl_scorer_whatever_the_domain(domain: str) -> None:
    source = source_for(domain)
    assert not verl_has_a_scorer_for(source)
    assert verl_reward.is_ours(source)
    assert not verl_reward.is_ours(domain or "stream-exporter")


def test_math_rows_score_every_recorded_answer_as_the_fleet_did(
    verl_dataset: list[dict[str, Any]],
) -> None:
    """Against the demo's ``answer``: the recorded completions (right ones and slips)
    get exactly their recorded rewards, new responses are checked too."""
    math_rows = [r for r in verl_dataset if r["ability"] == "math"]
    recorded = [
        (row, completion, reward)
        for row in math_rows
        for completion, reward in zip(
            row["extra_info"]["completions"], row["extra_info"]["rewards"], strict=True
        )
    ]
    assert {reward for _, _, reward in recorded} == {0.0, 1.0}, "the demo should slip sometimes"
    for row, completion, reward in recorded:
        assert row["reward_model"]["ground_truth"].isdigit()
        assert score(row, completion) == reward, completion
    row = math_rows[0]
    truth = row["reward_model"]["ground_truth"]
    assert score(row, f"Adding, then multiplying: \\boxed{{{truth}}}") == 1.0
    assert score(row, f"#### {int(truth) + 1}") == 0.0
    assert score(row, "I cannot tell.") == 0.0


def test_rows_without_a_ground_truth_score_recorded_text_and_refuse_new_text(
    verl_dataset: list[dict[str, Any]],
) -> None:
    rooms = [r for r in verl_dataset if r["ability"] == "text-adventure"]
    assert rooms and all(r["reward_model"]["ground_truth"] == "" for r in rooms)
    for row in rooms:
        info = row["extra_info"]
        for completion, reward in zip(info["completions"], info["rewards"], strict=True):
            # verl decodes its own tokens: spacing may differ from the recorded text
            assert score(row, "  " + completion.replace("\n\n", "\n") + "\n") == reward
    with pytest.raises(RewardError, match="no ground_truth") as refused:
        score(rooms[0], "Action: walk north")
    assert isinstance(refused.value, StreamExportError)
    assert refused.value.reason == "unscorable"


def test_a_text_recorded_with_different_rewards_scores_their_mean() -> None:
    row = {
        "data_source": "stream-export",
        "reward_model": {"ground_truth": ""},
        "extra_info": {"index": 0, "completions": ["go", "stay", "go"], "rewards": [1.0, 0.0, 0.5]},
    }
    assert score(row, "go") == 0.75


@pytest.mark.parametrize(
    ("response", "truth", "right"),
    [
        ("The answer is 1,234.", "1234", True),
        ("The answer is 1234.5", "1234.5", True),
        ("First 12, then 30.\nSo 42", "42", True),
        ("42 is close, but it is 41", "42", False),
        ("\\boxed{7} and later 8", "7", True),
        ("work #### -3", "-3", True),
        ("The exit is to the North.", "north", True),
        ("The exit is northwest.", "north", False),
        ("north\nNo, I give up.", "north", False),
        ("", "north", False),
    ],
)
def test_the_final_answer_rule(response: str, truth: str, right: bool) -> None:
    assert matches(response, truth) is right


def test_an_agent_chosen_data_source_goes_to_verls_own_scorer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """verl needs torch to import, so its scoring module is stood in for here: what is
    checked is that the call reaches it unchanged."""
    calls: list[tuple[Any, ...]] = []

    def default_compute_score(*args: Any, **kwargs: Any) -> dict[str, float]:
        calls.append((*args, kwargs))
        return {"score": -1.0, "acc": 0.0}

    stand_in = types.ModuleType("verl.utils.reward_score")
    stand_in.default_compute_score = default_compute_score  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "verl.utils.reward_score", stand_in)
    info = {"index": 3}
    got = compute_score(
        data_source="openai/gsm8k", solution_str="#### 72", ground_truth="72", extra_info=info
    )
    assert got == {"score": -1.0, "acc": 0.0}
    assert calls == [("openai/gsm8k", "#### 72", "72", info, {})]


def test_the_reward_module_imports_without_the_workers_dependencies(tmp_path: Path) -> None:
    """verl's workers load it by ``pkg://`` or by file; only the standard library and
    ``stream_export.errors`` may come with it."""
    import subprocess

    probe = (
        "import sys, stream_export.trainers.verl_reward\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'faust', 'mode', 'aiohttp', 'aiokafka', 'msgspec', 'pyarrow', 'prometheus_client'}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert done.stdout.strip() == "[]"
