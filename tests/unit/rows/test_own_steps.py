"""An episode whose agent reported its own steps between its model calls (a
Daydreams agent through the gateway's steps route) reads from those steps in the
text, conversational and messages formats: the task as prompt, the reasoning, an
``Action:`` line and the result as completion, the seed's shape; the tokens rows
still read the calls, and the episode format's llm_call steps carry their call."""

from __future__ import annotations

import msgspec

from stream_export.contract.episode import Episode
from stream_export.contract.events import Step
from stream_export.rows.formats import episode_records, messages_records, text_records
from stream_export.rows.tokens import token_records
from tests.support.call_episodes import tool_episode

TASK = "You are in a dark room with a door to the north."


def daydreams_episode() -> Episode:
    """The two-call episode with the agent's steps reported after each call."""
    base = tool_episode()
    eid = base.episode_id
    first, second = (s for s in base.steps if s.kind == "llm_call")

    def step(seq: int, kind: str, content: str = "", **fields: object) -> Step:
        return Step(episode_id=eid, time=20.0 + seq, seq=seq, kind=kind, content=content, **fields)  # type: ignore[arg-type]

    steps = [
        msgspec.structs.replace(first, seq=0),
        step(1, "thought", "I should check the door."),
        step(2, "action", name="open_door", arguments={"direction": "north"}, id="c1"),
        step(3, "action_result", "The door opens.", name="open_door", id="c1"),
        msgspec.structs.replace(second, seq=4),
        step(5, "thought", "I left."),
        step(6, "output", "I am out.", name="text"),
    ]
    return msgspec.structs.replace(base, prompt=TASK, steps=steps)


def test_the_text_record_is_the_task_then_reasoning_action_line_and_result() -> None:
    (record,) = text_records(daydreams_episode(), per_step=False)
    assert record == {
        "prompt": TASK,
        "completion": "I should check the door.\n\n"
        'Action: open_door({"direction":"north"})\n\n'
        "The door opens.\n\nI left.\n\nI am out.",
    }


def test_messages_alternate_and_the_result_is_a_tool_turn() -> None:
    (record,) = messages_records(daydreams_episode(), per_step=False)
    assert [m["role"] for m in record["messages"]] == ["user", "assistant", "tool", "assistant"]


def test_tokens_rows_still_read_the_calls() -> None:
    assert token_records(daydreams_episode()) == token_records(tool_episode())


def test_an_agent_step_before_the_first_call_only_keeps_reading_the_calls() -> None:
    (record,) = text_records(tool_episode(), per_step=False)  # a thought, then two calls
    assert "Let me look." not in record["completion"]


def test_the_episode_formats_llm_call_step_carries_its_request_and_response() -> None:
    (record,) = episode_records(daydreams_episode(), per_step=False)
    call, action = record["steps"][0], record["steps"][2]
    assert call["call"]["request"]["messages"][1]["role"] == "user"
    assert call["call"]["response"]["content"] is not None or call["call"]["response"]["tool_calls"]
    assert call["call"]["finish_reason"] and "prompt_token_ids" not in call["call"]
    assert (action["id"], action["call"]) == ("c1", None)
