"""Every built-in output's columns, in order, each with the kind of value it holds:
what a row of each output is, whichever module writes it.

A kind names an Arrow type (:mod:`.schema` builds the schemas from these; the
numeric ones are the contract's widths). A row may leave a column out (a text
rollout's token columns): readers see null there.
"""

from __future__ import annotations

from typing import Final

#: A score as the outputs write it (``ScoreRecord``): every field, in its order.
SCORE: Final = (
    ("score_id", "text"),
    ("name", "text"),
    ("value", "float"),
    ("evaluator", "evaluator"),
    ("time", "float"),
    ("label", "text"),
    ("request_id", "text"),
    ("seq", "int"),
)
#: Metadata fields of fixed type (formats' core and label fields, and ``decision``).
METADATA: Final = {
    "episode_id": "text",
    "agent_id": "text",
    "group_id": "text",
    "outcome": "text",
    "reward": "float",
    "steps": "int",
    "duration": "float",
    "truncated": "bool",
    "truncated_reason": "text",
    "start_time": "float",
    "end_time": "float",
    "domain": "text",
    "difficulty": "text",
    "decision": "int",
    "rewards": "rewards",
    "scores": "scores",
    "scores_missing": "texts",
}
#: A weight version is an integer or a string as the server reports it: text holds both.
TOKENS: Final = (
    ("input_ids", "ids"),
    ("loss_mask", "mask"),
    ("logprobs", "logprobs"),
    ("prompt_len", "int"),
    ("weight_version_min", "text"),
    ("weight_version_max", "text"),
    ("call_starts", "ints"),
    ("call_ends", "ints"),
    ("call_weight_versions", "texts"),
)
#: The episode output's built-in formats that have a schema (not ``episode``).
FORMATS: Final = {
    "text": (("prompt", "text"), ("completion", "text")),
    "conversational": (("prompt", "messages"), ("completion", "messages"), ("tools", "text")),
    "messages": (("messages", "messages"), ("tools", "text")),
    "tokens": (
        *TOKENS,
        ("episode_id", "text"),
        ("segment", "int"),
        ("reward", "float"),
        ("outcome", "text"),
        ("group_id", "text"),
    ),
}
#: The groups stage's outputs, by the suffix of their file prefix (rows.groups).
GROUP_OUTPUTS: Final = {
    "groups": (
        ("group_id", "text"),
        ("prompt", "text"),
        ("completions", "texts"),
        ("episode_ids", "texts"),
        ("rewards", "floats"),
        ("advantages", "floats"),
        ("outcomes", "texts"),
        ("size", "int"),
        ("expected_size", "int"),
        ("complete", "bool"),
        ("close_reason", "text"),
        ("missing", "int"),
        ("truncated", "int"),
        ("duplicates", "int"),
        ("mean", "float"),
        ("std", "float"),
        ("zero_variance", "bool"),
        ("estimator", "text"),
        ("eps", "float"),
    ),
    "rollouts": (
        ("prompt", "text"),
        ("completion", "text"),
        *TOKENS,
        ("uid", "text"),
        ("episode_id", "text"),
        ("reward", "float"),
        ("advantage", "float"),
        ("outcome", "text"),
        ("group_size", "int"),
        ("group_mean", "float"),
        ("group_std", "float"),
        ("zero_variance", "bool"),
        ("complete", "bool"),
        ("close_reason", "text"),
        ("segment", "int"),
        ("stale", "bool"),
    ),
    "preference": (
        ("prompt", "text"),
        ("chosen", "text"),
        ("rejected", "text"),
        ("group_id", "text"),
        ("chosen_reward", "float"),
        ("rejected_reward", "float"),
        ("margin", "float"),
    ),
    "kto": (("prompt", "text"), ("completion", "text"), ("label", "bool"), ("group_id", "text")),
    "prompts": (
        ("prompt", "text"),
        ("group_id", "text"),
        ("pass_rate", "float"),
        ("mean_reward", "float"),
        ("scored", "int"),
    ),
}
#: The scores output: one row per score that came after its episode (``ScoreRow``).
SCORE_ROWS: Final = (("record_id", "text"), ("episode_id", "text"), *SCORE)
