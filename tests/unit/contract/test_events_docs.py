"""The contract page's examples are real: the events decode, are the exact bytes the
Python client sends and form one complete episode (the records made from them:
tests/unit/docs/test_records.py)."""

from __future__ import annotations

import re
from pathlib import Path

from stream_export.contract.decoding import decode_event, encode
from stream_export.contract.events import EpisodeEnd, EpisodeStart, Step

PAGE = Path(__file__).resolve().parents[3] / "docs" / "contract" / "events.md"


def contract_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), flags=re.S)


def test_the_dark_room_example_is_one_complete_episode_in_canonical_bytes() -> None:
    block, _ = contract_blocks("jsonl")
    lines = block.strip().splitlines()
    events = [decode_event(line.encode()) for line in lines]
    assert [encode(e).decode() for e in events] == lines
    start, *steps, end = events
    assert isinstance(start, EpisodeStart) and isinstance(end, EpisodeEnd)
    assert [s.kind for s in steps if isinstance(s, Step)] == ["thought", "action", "action_result"]
    assert [s.seq for s in steps if isinstance(s, Step)] == list(range(end.steps))
    assert {e.episode_id for e in events} == {start.episode_id}


def test_the_llm_call_example_is_a_delta_call_in_canonical_bytes() -> None:
    _, block = contract_blocks("jsonl")
    (line,) = block.strip().splitlines()
    step = decode_event(line.encode())
    assert encode(step).decode() == line
    assert isinstance(step, Step) and step.kind == "llm_call" and step.call is not None
    assert step.call.prompt_base == 0 and step.call.response.reasoning
    tool = step.call.request.messages[-1]
    assert tool.role == "tool" and tool.tool_call_id == "call_1"
