"""The built-in formats: an episode -> its records, with their metadata columns.
Pure functions, no I/O.

Built-in formats (README section "Training record formats" has examples):

``text``            ``{"prompt": str, "completion": str}`` -- the Daydreams export; the
                    completion starts with ``format.text_separator``.
``conversational``  prompt and completion as lists of ``{"role", "content", "name"}``
                    messages (TRL's conversational prompt-completion shape).
``messages``        ``{"messages": [...]}``: the conversational prompt and completion as
                    one list (what verl's and TRL's SFT datasets read).
``episode``         the whole structured episode.
``tokens``          one row per token segment of the episode's model calls
                    (:mod:`.tokens`): what token-level RL trainers read as is.

An episode with model calls (``llm_call`` steps) reads from its calls in the text,
conversational and messages formats (see :mod:`.calls`), unless its agent reported
its own steps after its first call (a thought, action, output or message: a
Daydreams agent through the gateway's steps route): then it reads from those,
without the calls (:func:`.episode.own_steps`).

How an episode reads is :mod:`.episode`; what a custom formatter may return,
:mod:`.custom`; the sink writes these records through
:mod:`stream_export.output.formatter`.

Bytes are deterministic: keys in the documented order, UTF-8 without escaping
non-ASCII, one object per line, ``", "`` and ``": "`` separators (the seed's
spelling, and Python's ``json.dumps(..., ensure_ascii=False)``), floats in their
shortest round-trip form in msgspec's notation (``1e-6`` where Python has ``1e-06``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Final

import msgspec

from stream_export.contract.episode import Episode
from stream_export.errors import ConfigError
from stream_export.rows import calls, tokens
from stream_export.rows.episode import (
    Record,
    decisions,
    first_agent_step,
    join,
    json_text,
    own_steps,
    prompt_messages,
    prompt_text,
    step_messages,
    step_record,
    step_text,
)
from stream_export.settings.format import FormatSettings

BUILTIN_FORMATS: Final = ("text", "conversational", "messages", "episode", "tokens")
#: ``format.text_separator`` -> what a text completion starts with.
SEPARATORS: Final = {"blank_line": "\n\n", "newline": "\n", "space": " ", "none": ""}
#: Metadata fields written when ``metadata_fields`` is empty (plus ``decision`` at
#: step granularity).
DEFAULT_METADATA_FIELDS: Final = (
    "episode_id",
    "agent_id",
    "group_id",
    "outcome",
    "reward",
    "steps",
    "duration",
    "truncated",
    "truncated_reason",
    "domain",
    "difficulty",
)
#: The episode's scores, by name and in full, and the required names it lacks.
SCORE_FIELDS: Final = ("rewards", "scores", "scores_missing")

_encoder: Final = msgspec.json.Encoder()


def rewards_column(episode: Episode) -> list[dict[str, Any]]:
    """The episode's ``rewards`` as the outputs write them: ``{"name", "value"}`` in
    its order (a column of one type; a map of any names has none in ``datasets``)."""
    return [{"name": name, "value": value} for name, value in episode.rewards.items()]


def scores_column(episode: Episode) -> list[dict[str, Any]]:
    """The episode's ``scores`` as the outputs write them, every field in each."""
    columns: list[dict[str, Any]] = msgspec.to_builtins(episode.scores)
    return columns


_CORE_FIELDS: Final[dict[str, Callable[[Episode], Any]]] = {
    "episode_id": lambda e: e.episode_id,
    "agent_id": lambda e: e.agent_id,
    "group_id": lambda e: e.group_id or "",
    "outcome": lambda e: e.outcome,
    "reward": lambda e: e.reward,
    "steps": lambda e: len(e.steps),
    "duration": lambda e: float(e.duration),
    "truncated": lambda e: e.truncated,
    "truncated_reason": lambda e: e.truncated_reason or "",
    "start_time": lambda e: float(e.start_time),
    "end_time": lambda e: float(e.end_time),
    "rewards": rewards_column,
    "scores": scores_column,
    "scores_missing": lambda e: e.scores_missing,
}
#: Metadata keys written as text whatever the agent sent ("" when absent), so the
#: column keeps one type. Text columns are never null: a column null in every row of
#: a file has no type, and ``datasets`` then cannot load that file with the others.
_LABEL_FIELDS: Final = frozenset({"domain", "difficulty"})


def separator(settings: FormatSettings) -> str:
    """What a text completion starts with (``format.text_separator``)."""
    return SEPARATORS[settings.text_separator]


def encode(record: Record) -> bytes:
    """One JSON line (no newline) in the deterministic spelling described above."""
    return msgspec.json.format(_encoder.encode(record), indent=0)


# -- reading an episode -------------------------------------------------------


# -- built-in formats ---------------------------------------------------------
# Each maker returns the records of one episode without metadata: a single one at
# episode granularity, one per decision (in order) at step granularity.

Maker = Callable[[Episode], list[Record]]


def text_records(episode: Episode, per_step: bool, separator: str = "") -> list[Record]:
    """Text records; each completion starts with ``separator`` (trainers join prompt
    and completion as they are)."""
    own = own_steps(episode)
    if own is None:
        return calls.text_records(episode, per_step, separator)
    episode = own
    texts = [step_text(s) for s in episode.steps]
    base = prompt_text(episode.prompt)
    spans = decisions(episode.steps)
    if not per_step:
        lead = first_agent_step(spans, episode.steps)
        spans = [(lead, len(texts))]
    records = []
    for start, end in spans:
        completion = join(texts[start:end])
        if completion:
            prompt = join([base, *texts[:start]])
            records.append({"prompt": prompt, "completion": separator + completion})
    return records


def conversational_records(episode: Episode, per_step: bool) -> list[Record]:
    own = own_steps(episode)
    if own is None:
        return calls.conversation_records(episode, per_step)
    episode = own
    steps = episode.steps
    spans = decisions(steps)
    if not per_step:
        spans = [(first_agent_step(spans, steps), len(steps))]
    records = []
    for start, end in spans:
        completion = step_messages(steps[start:end])
        if completion:
            prompt = prompt_messages(episode.prompt) + step_messages(steps[:start])
            records.append({"prompt": prompt, "completion": completion})
    return records


def messages_records(episode: Episode, per_step: bool) -> list[Record]:
    """The conversational record as one conversation (episode granularity only)."""
    return [
        {
            "messages": r["prompt"] + r["completion"],
            **({"tools": r["tools"]} if "tools" in r else {}),
        }
        for r in conversational_records(episode, per_step)
    ]


def episode_records(episode: Episode, per_step: bool) -> list[Record]:
    header = {
        "episode_id": episode.episode_id,
        "agent_id": episode.agent_id,
        "group_id": episode.group_id or "",
        "outcome": episode.outcome,
        "reward": episode.reward,
        **{name: _CORE_FIELDS[name](episode) for name in SCORE_FIELDS},
        "start_time": float(episode.start_time),
        "end_time": float(episode.end_time),
        "duration": float(episode.duration),
        "truncated": episode.truncated,
        "truncated_reason": episode.truncated_reason or "",
        "metadata": episode.metadata,
        "prompt": prompt_messages(episode.prompt),
    }
    steps = [step_record(s) for s in episode.steps]
    if not per_step:
        return [{**header, "steps": steps}]
    return [
        {**header, "decision": i, "history": steps[:start], "steps": steps[start:end]}
        for i, (start, end) in enumerate(decisions(episode.steps))
    ]


_MAKERS: Final[dict[str, Callable[[Episode, bool], list[Record]]]] = {
    "text": text_records,
    "conversational": conversational_records,
    "messages": messages_records,
    "episode": episode_records,
    "tokens": lambda episode, _: tokens.token_records(episode),
}
#: The keys of a built-in record, which metadata columns must not overwrite.
_RECORD_KEYS: Final = {"messages": ("messages", "tools"), "tokens": tokens.TOKEN_COLUMNS}


# -- metadata -----------------------------------------------------------------


def _label(value: Any) -> str | None:
    """A metadata value as text: strings as is, lists comma-joined, others as JSON."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        return ",".join(v for v in map(_label, value) if v is not None)
    return json_text(value)


def _field_getter(name: str) -> Callable[[Episode], Any]:
    core = _CORE_FIELDS.get(name)
    if core is not None:
        return core
    if name in _LABEL_FIELDS:
        return lambda e: _label(e.metadata.get(name)) or ""
    return lambda e: e.metadata.get(name)


def metadata_names(settings: FormatSettings) -> list[str]:
    """The metadata fields a built-in format adds to each record, in order (none with
    ``metadata_mode = "none"``); raises ConfigError for a choice that cannot work."""
    if settings.metadata_mode == "none":
        return []
    per_step = settings.granularity == "step"
    names = list(settings.metadata_fields or DEFAULT_METADATA_FIELDS)
    if per_step and "decision" not in names and not settings.metadata_fields:
        names.append("decision")
    if len(set(names)) != len(names):
        raise ConfigError(f"format.metadata_fields lists a field twice: {names}")
    if "decision" in names and not per_step:
        raise ConfigError('metadata field "decision" needs format.granularity = "step"')
    own = _RECORD_KEYS.get(settings.format, ("prompt", "completion", "tools"))
    if settings.format == "tokens":  # its own columns already hold these
        names = [n for n in names if n not in _CORE_FIELDS or n not in own]
    clash = set(own).intersection(names) if settings.metadata_mode == "columns" else set()
    if clash:
        raise ConfigError(f"metadata columns would overwrite {sorted(clash)}; use another name")
    return names


def _with_metadata(settings: FormatSettings, make: Maker) -> Maker:
    """Add the chosen metadata fields to every record: as top-level columns, nested
    under "metadata", or not at all."""
    mode = settings.metadata_mode
    if mode == "none":
        return make
    names = metadata_names(settings)
    getters = [(n, _field_getter(n)) for n in names if n != "decision"]
    with_decision = "decision" in names

    def make_with_metadata(episode: Episode) -> list[Record]:
        values = {name: get(episode) for name, get in getters}
        records = make(episode)
        for i, record in enumerate(records):
            fields = {**values, "decision": i} if with_decision else values
            if mode == "columns":
                record.update(fields)
            else:
                record["metadata"] = fields
        return records

    return make_with_metadata


def builtin_maker(settings: FormatSettings) -> Maker:
    builtin = _MAKERS[settings.format]
    per_step = settings.granularity == "step"
    if per_step and settings.format in ("messages", "tokens"):
        # SFT trainers learn every assistant turn of a conversation: per decision,
        # the earlier turns would be learnt again in each later record (a token
        # segment is a whole run of calls, for the same reason).
        raise ConfigError(
            f'format "{settings.format}" writes whole conversations: use granularity "episode"'
        )
    if settings.format == "text":
        builtin = functools.partial(text_records, separator=separator(settings))

    def make(episode: Episode) -> list[Record]:
        return builtin(episode, per_step)

    # The episode record carries every field already: metadata settings do not apply.
    return make if settings.format == "episode" else _with_metadata(settings, make)


# -- custom formatters --------------------------------------------------------


# -- the sink's entry point ---------------------------------------------------
