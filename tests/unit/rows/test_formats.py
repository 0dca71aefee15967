"""Training-record formats: golden files, the seed's example, metadata, filters, plug-ins.

Golden outputs live in tests/golden/; regenerate them after an intended change with
``UPDATE_GOLDEN=1 pytest tests/unit/rows/test_formats.py`` and review the diff. The
seed's two lines (tests/golden/seed.jsonl) are typed from the Daydreams docs and
are never regenerated.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_export.contract.decoding import decode_episode, encode
from stream_export.contract.episode import Episode
from stream_export.errors import ConfigError, FormatError, StreamExportError
from stream_export.output.formatter import build
from stream_export.rows import custom, formats
from stream_export.rows.episode import prompt_text, step_text
from stream_export.runtime.metrics import Metrics
from stream_export.settings.format import FormatSettings
from tests.support.golden import (
    GOLDEN,
    GOLDEN_CASES,
    by_id,
    filtered,
    golden_episodes,
    is_trl_conversational,
    run,
)


def test_seed_example_is_reproduced_byte_for_byte() -> None:
    seed = (GOLDEN / "seed.jsonl").read_bytes().splitlines()
    episodes = [by_id("seed-result"), by_id("seed-action")]
    daydreams = build(FormatSettings(text_separator="none"), Metrics())
    assert [line for episode in episodes for line in daydreams(episode)] == seed
    # Metadata columns come after the very same prompt and completion.
    for line, seed_line in zip(run(episodes, text_separator="none"), seed, strict=True):
        assert line.startswith(seed_line[:-1] + b", ")
    # By default the completion alone differs: it starts with a blank line.
    default = build(FormatSettings(), Metrics())
    for episode, seed_line in zip(episodes, seed, strict=True):
        want = json.loads(seed_line)
        [got] = [json.loads(line) for line in default(episode)]
        assert got == {**want, "completion": "\n\n" + want["completion"]}


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_golden_files(case: str) -> None:
    got = b"".join(line + b"\n" for line in run(golden_episodes(), **GOLDEN_CASES[case]))
    path = GOLDEN / f"{case}.jsonl"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_bytes(got)
    assert got == path.read_bytes(), f"{path} differs; UPDATE_GOLDEN=1 rewrites it"


def test_bytes_are_deterministic_utf8_with_spaced_separators() -> None:
    episode = by_id("cellar-7")
    again = decode_episode(encode(episode))
    for case in GOLDEN_CASES.values():
        first = run([episode], **case)
        assert first == run([again], **case)
        assert "☕".encode() in b"".join(first)
        for line in first:
            assert b"\n" not in line and b"\\u" not in line
            assert line == json.dumps(json.loads(line), ensure_ascii=False).encode()


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(blacklist_categories=["Cs"])),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)


def _plain(value: Any) -> bool:
    """No float below 1e-4 (but 0) or from 1e16 on, in ``value``."""
    if isinstance(value, float):
        return value == 0 or 1e-4 <= abs(value) < 1e16
    if isinstance(value, list | dict):
        return all(map(_plain, value.values() if isinstance(value, dict) else value))
    return True


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6))
@settings(max_examples=500)
def test_a_line_reads_back_exactly_and_is_json_dumps_but_for_float_notation(
    record: dict[str, Any],
) -> None:
    """The README's promise: ``json.dumps``'s bytes, floats in msgspec's shortest
    round-trip notation (the same digits, ``1e-06`` written ``1e-6``), every
    float read back exactly."""
    line = formats.encode(record)
    assert json.loads(line) == record
    if _plain(record):
        assert line == json.dumps(record, ensure_ascii=False).encode()
    assert formats.encode({"x": -3.36e-6}) == b'{"x": -3.36e-6}'  # not json.dumps's -3.36e-06


def test_text_reads_steps_as_paragraphs() -> None:
    [record] = [json.loads(line) for line in run([by_id("cellar-7")], metadata_mode="none")]
    assert record["prompt"] == (
        "You are an adventurer. Answer with one action at a time.\n\n"
        "You wake up in a pitch-black cellar. Somewhere to the east, water drips."
    )
    paragraphs = record["completion"].removeprefix("\n\n").split("\n\n")
    assert paragraphs[1] == "Action: search the east wall"
    assert paragraphs[4] == 'Action: use_item({"item":"rusty key","target":"door"})'
    assert paragraphs[5] == '{"door":"open","turns":3}'
    # Observations before the agent's first step belong to the prompt.
    [math] = [json.loads(line) for line in run([by_id("math-42")])]
    assert math["prompt"].endswith("\n\nCalculator ready.")
    assert math["completion"].startswith("\n\nFirst add 12 and 30.")


@pytest.mark.parametrize("granularity", ["episode", "step"])
def test_conversational_is_what_trl_detects(granularity: str) -> None:
    lines = run(golden_episodes(), format="conversational", granularity=granularity)
    records = [json.loads(line) for line in lines]
    assert records
    for record in records:
        assert is_trl_conversational(record["prompt"])
        assert is_trl_conversational(record["completion"])
        assert record["completion"][0]["role"] == "assistant"
        for message in record["prompt"] + record["completion"]:
            assert list(message) == ["role", "content", "name"]
            assert message["role"] in {"system", "user", "assistant", "tool"}
        if granularity == "step":
            assert len(record["completion"]) == 1
    cellar = next(r for r in records if r["episode_id"] == "cellar-7")
    assert [m["role"] for m in cellar["prompt"]][:2] == ["system", "user"]
    tools = [m for r in records for m in r["prompt"] + r["completion"] if m["role"] == "tool"]
    assert tools and all(m["name"] for m in tools)


@pytest.mark.parametrize("fmt", ["text", "conversational"])
def test_step_prompt_is_everything_seen_before_the_decision(fmt: str) -> None:
    episode = by_id("math-42")
    per_step = [json.loads(line) for line in run([episode], format=fmt, granularity="step")]
    [whole] = [json.loads(line) for line in run([episode], format=fmt)]
    assert [r["decision"] for r in per_step] == [0, 1, 2]
    assert per_step[0]["prompt"] == whole["prompt"]
    for before, after in itertools.pairwise(per_step):
        seen = after["prompt"]
        if fmt == "text":
            # the completion starts with the separator: joined, they read as seen
            assert seen.startswith(before["prompt"] + before["completion"] + "\n\n")
        else:
            assert seen[: len(before["prompt"]) + 1] == before["prompt"] + before["completion"]
    last = "\n\nThe answer is 126." if fmt == "text" else [whole["completion"][-1]]
    assert per_step[-1]["completion"] == last


def test_metadata_columns_nested_and_chosen_fields() -> None:
    episode = by_id("math-42")
    [columns] = [json.loads(line) for line in run([episode])]
    assert list(columns) == ["prompt", "completion", *formats.DEFAULT_METADATA_FIELDS]
    assert columns["difficulty"] == "2"  # labels are text, whatever the agent sent
    assert (columns["steps"], columns["duration"], columns["group_id"]) == (9, 2.5, "")
    [nested] = [json.loads(line) for line in run([episode], metadata_mode="nested")]
    assert list(nested) == ["prompt", "completion", "metadata"]
    assert nested["metadata"] == {k: columns[k] for k in formats.DEFAULT_METADATA_FIELDS}
    chosen = ["reward", "tags", "start_time", "decision"]
    [first, *_] = run([by_id("cellar-7")], granularity="step", metadata_fields=chosen)
    assert list(json.loads(first)) == ["prompt", "completion", *chosen]
    assert json.loads(first)["tags"] == ["cellar", "key"]


@pytest.mark.parametrize(
    "settings",
    [
        {"format": "no-such-format"},
        {"format": "tests.unit.rows.test_formats:missing"},
        {"format": "no_such_module_here:fn"},
        {"format": "tests.unit.rows.test_formats:GOLDEN"},
        {"metadata_fields": ["prompt"]},
        {"metadata_fields": ["reward", "reward"]},
        {"metadata_fields": ["decision"]},
        {"min_steps": 5, "max_steps": 2},
    ],
)
def test_unusable_settings_raise_config_error(settings: dict[str, Any]) -> None:
    settings.setdefault("metadata_mode", "columns")
    with pytest.raises(ConfigError):
        build(FormatSettings(**settings), Metrics())


@pytest.mark.parametrize(
    ("settings", "kept", "reason"),
    [
        ({"only_success": True}, {"seed-result", "cellar-7", "math-42"}, "not_success"),
        ({"min_steps": 3}, {"cellar-7", "math-42"}, "too_few_steps"),
        ({"max_steps": 2}, {"seed-result", "seed-action", "silent-1"}, "too_many_steps"),
        ({"min_reward": 0.8}, {"seed-result", "math-42"}, "low_reward"),
        ({"domains": ["math"]}, {"math-42"}, "domain"),
    ],
)
def test_filters_drop_and_count_by_reason(
    settings: dict[str, Any], kept: set[str], reason: str
) -> None:
    metrics = Metrics()
    lines = run(golden_episodes(), metrics, format="episode", **settings)
    assert {json.loads(line)["episode_id"] for line in lines} == kept
    dropped = 5 - len(kept)
    counted = filtered(metrics, reason) + filtered(metrics, "no_reward")
    assert counted == dropped


def test_episode_without_agent_steps_is_counted_not_written() -> None:
    metrics = Metrics()
    assert run([by_id("silent-1")], metrics) == []
    assert run([by_id("silent-1")], metrics, format="conversational", granularity="step") == []
    assert filtered(metrics, "empty") == 2
    assert len(run([by_id("silent-1")], metrics, format="episode")) == 1


# -- custom formatters (found by dotted path, and by entry point below) --------


def prompt_and_id(episode: Episode) -> dict[str, Any]:
    return {"prompt": prompt_text(episode.prompt), "id": episode.episode_id}


def one_per_step(episode: Episode) -> list[dict[str, Any]] | None:
    return [{"seq": s.seq, "text": step_text(s)} for s in episode.steps] or None


def skip_all(episode: Episode) -> None:
    return None


def broken(episode: Episode) -> dict[str, Any]:
    return {"ratio": len(episode.steps) / 0}


def wrong_type(episode: Episode) -> Any:
    return "prompt"


def unencodable(episode: Episode) -> Any:
    return {"value": object()}


def test_custom_formatter_by_dotted_path() -> None:
    episodes = golden_episodes()
    lines = run(episodes, format=f"{__name__}:prompt_and_id", metadata_mode="nested")
    assert json.loads(lines[0]) == {"prompt": episodes[0].prompt, "id": "seed-result"}
    many = run([by_id("cellar-7")], format=f"{__name__}:one_per_step")
    assert [json.loads(line)["seq"] for line in many] == list(range(7))
    metrics = Metrics()
    assert run(episodes, metrics, format=f"{__name__}:skip_all", only_success=True) == []
    assert (filtered(metrics, "custom"), filtered(metrics, "not_success")) == (3, 2)


@pytest.mark.parametrize(
    ("function", "summary"),
    [
        ("broken", "ZeroDivisionError: division by zero"),
        ("wrong_type", "returned str; expected a dict, a list of dicts or None"),
        ("unencodable", "TypeError"),
    ],
)
def test_custom_formatter_failure_is_a_format_error(function: str, summary: str) -> None:
    formatter = build(FormatSettings(format=f"{__name__}:{function}"), Metrics())
    with pytest.raises(FormatError) as info:
        formatter(by_id("seed-result"))
    assert isinstance(info.value, StreamExportError)
    assert info.value.reason == "format_error"
    assert summary in info.value.detail and function in info.value.detail
    assert len(info.value.detail) < 400


def test_custom_formatter_by_entry_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tiny_formatter.py").write_text(
        "def to_record(episode):\n    return {'prompt': episode.episode_id, 'tiny': True}\n"
    )
    dist = tmp_path / "tiny_formatter-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-formatter\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        f"[{custom.ENTRY_POINT_GROUP}]\ntiny = tiny_formatter:to_record\n"
    )
    with pytest.raises(ConfigError, match="registered: none"):
        build(FormatSettings(format="tiny"), Metrics())
    monkeypatch.syspath_prepend(str(tmp_path))
    [line] = run([by_id("math-42")], format="tiny")
    assert line == b'{"prompt": "math-42", "tiny": true}'
