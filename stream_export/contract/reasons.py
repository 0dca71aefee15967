"""Every reason a message can be dead-lettered for, named once.

The value is the ``x-reason`` header of the dead letter and the ``reason`` label
of ``dead_letters`` (and of ``events_invalid`` for the ones that are invalid
input). A pure module (no I/O imports), so the decoders and state machines can
name their reasons too. tests/unit/test_readme_tables.py checks the README's
"Bad input" table lists exactly these.
"""

from __future__ import annotations

from enum import StrEnum


class DeadLetterReason(StrEnum):
    # decoding (stage decode; the sink and the groups stage decode with the same reasons)
    NOT_JSON = "not_json"
    INVALID = "invalid"
    TOO_LARGE = "too_large"
    TOO_DEEP = "too_deep"
    UNKNOWN_TYPE = "unknown_type"
    UNSUPPORTED_VERSION = "unsupported_version"
    CALL_TOO_LARGE = "call_too_large"
    TOKEN_LENGTH_MISMATCH = "token_length_mismatch"
    OUT_OF_RANGE = "out_of_range"
    NON_FINITE = "non_finite"
    SCORE_TOO_LARGE = "score_too_large"
    # assembly: a valid event the assembler rejects
    FUTURE_TIME = "future_time"
    KEY_MISMATCH = "key_mismatch"
    SEQ_OUT_OF_RANGE = "seq_out_of_range"
    MAX_STEPS = "max_steps"
    MAX_BYTES = "max_bytes"
    MAX_DURATION = "max_duration"
    STATE_EXPIRED = "state_expired"
    INTERNAL_ERROR = "internal_error"
    LATE_EVENT = "late_event"
    CONFLICTING_DUPLICATE = "conflicting_duplicate"
    MISSING_START = "missing_start"
    TOKEN_BASE_MISSING = "token_base_missing"
    # scores
    UNKNOWN_EPISODE = "unknown_episode"
    TOO_MANY_SCORES = "too_many_scores"
    LATE_SCORE = "late_score"
    # formatting and groups
    FORMAT_ERROR = "format_error"
    LATE_ROLLOUT = "late_rollout"
    GROUP_TOO_LARGE = "group_too_large"
    GROUP_PROMPT_MISMATCH = "group_prompt_mismatch"
