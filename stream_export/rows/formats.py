"""Episode -> GRPO training record(s): pure functions, no I/O.

The sink depends only on :func:`build`: it returns a :data:`Formatter` that turns
one episode into the encoded JSON lines to write (no trailing newline), an empty
list when a filter drops the episode (counted in ``episodes_filtered``), or raises
FormatError (the sink dead-letters the episode).

Built-in formats (README section "Training record formats" has examples):

``text``            ``{"prompt": str, "completion": str}`` -- the Daydreams export; the
                    completion starts with ``format.text_separator``.
``conversational``  prompt and completion as lists of ``{"role", "content", "name"}``
                    messages (TRL's conversational prompt-completion shape).
``messages``        ``{"messages": [...]}``: the conversational prompt and completion as
                    one list (what verl's and TRL's SFT datasets read).
``episode``         the whole structured episode.
``tokens``          one row per token segment of the episode's model calls
                    (``rows.tokens``): what token-level RL trainers read as is.

An episode with model calls (``llm_call`` steps) reads from its calls in the text,
conversational and messages formats (see ``rows.tokens``).

How an episode reads: the prompt is what the agent was given (chat messages are
joined with a blank line in the text format) followed by any observations before
its first own step. Agent steps are ``thought``, ``action``, ``output`` and
``message``; ``observation`` and ``action_result`` come from the environment. In
text, each step is one paragraph (parts are joined with a blank line), an action
reads ``Action: <content>`` (or ``Action: name({arguments})`` when it has no
content), and a step without content shows its ``data`` as JSON.

A *decision* is a run of agent steps that ends with an action or an output (or
where the environment answers). At ``granularity = "step"`` each decision is one
record: its prompt is everything the agent had seen before it, its completion is
the decision's own steps.

Bytes are deterministic: keys in the documented order, UTF-8 without escaping
non-ASCII, one object per line, ``", "`` and ``": "`` separators (the seed's
spelling, and Python's ``json.dumps(..., ensure_ascii=False)``), floats in their
shortest round-trip form in msgspec's notation (``1e-6`` where Python has ``1e-06``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from importlib import import_module, metadata
from typing import Any, Final, NamedTuple

import msgspec

from stream_export.contract.calls import WeightVersion
from stream_export.contract.episode import Episode
from stream_export.contract.events import Prompt, Step
from stream_export.errors import ConfigError, FormatError
from stream_export.output import filters
from stream_export.rows import tokens
from stream_export.runtime.metrics import Metrics
from stream_export.settings.format import FormatSettings

Formatter = Callable[[Episode], list[bytes]]


class Read(NamedTuple):
    """What a sink makes of one message."""

    record_id: str
    lines: list[bytes]
    end_time: float
    #: The partition-folder value (``sink.partition_by``).
    folder: object = None
    #: Lowest and highest weight version of the model calls behind the lines
    #: (None: none), for the manifest.
    versions: tuple[WeightVersion, WeightVersion] | None = None


#: What a sink reads a message with; raises DecodeError (not a record) or FormatError.
Reader = Callable[[bytes | None], Read]
Record = dict[str, Any]
#: What a custom formatter returns for one episode.
CustomResult = Record | list[Record] | None
CustomFormatter = Callable[[Episode], CustomResult]

ENTRY_POINT_GROUP: Final = "stream_export.formatters"
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
AGENT_KINDS: Final = frozenset({"thought", "action", "output", "message"})
_DECISION_ENDS: Final = frozenset({"action", "output"})
_SEP: Final = "\n\n"
_MAX_SUMMARY: Final = 300

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


def _json_text(value: Any) -> str:
    return _encoder.encode(value).decode()


def step_text(step: Step) -> str:
    """A step as one paragraph of the text format ("" when it has nothing to show)."""
    if step.kind == "action":
        if step.content:
            return f"Action: {step.content}"
        args = "" if step.arguments is None else _json_text(step.arguments)
        return f"Action: {step.name or ''}({args})"
    if step.content or step.data is None:
        return step.content
    return _json_text(step.data)


def decisions(steps: list[Step]) -> list[tuple[int, int]]:
    """``(start, end)`` slices of ``steps``, one per decision, in order."""
    spans: list[tuple[int, int]] = []
    start: int | None = None
    for i, step in enumerate(steps):
        if step.kind in AGENT_KINDS:
            if start is None:
                start = i
            if step.kind in _DECISION_ENDS:
                spans.append((start, i + 1))
                start = None
        elif start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(steps)))
    return spans


def _join(parts: Iterable[str]) -> str:
    return _SEP.join(p for p in parts if p)


def prompt_text(prompt: Prompt) -> str:
    return prompt if isinstance(prompt, str) else _join(m.content for m in prompt)


def _message(role: str, content: str, name: str | None = None) -> Record:
    return {"role": role, "content": content, "name": name}


def prompt_messages(prompt: Prompt) -> list[Record]:
    if isinstance(prompt, str):
        return [_message("user", prompt)]
    return [_message(m.role, m.content, m.name) for m in prompt]


def step_messages(steps: Iterable[Step]) -> list[Record]:
    """Chat messages for steps: consecutive agent steps form one assistant turn,
    action results are tool messages (named after the action), observations are
    user messages."""
    out: list[Record] = []
    merge = False
    for step in steps:
        text = step_text(step)
        if not text:
            continue
        if step.kind in AGENT_KINDS:
            if merge:
                out[-1]["content"] += _SEP + text
            else:
                out.append(_message("assistant", text))
            merge = True
            continue
        merge = False
        if step.kind == "action_result":
            out.append(_message("tool", text, step.name))
        else:
            out.append(_message("user", text))
    return out


def _step_record(step: Step) -> Record:
    return {
        "seq": step.seq,
        "time": float(step.time),
        "kind": step.kind,
        "content": step.content,
        "name": step.name,
        "arguments": step.arguments,
        "data": step.data,
    }


# -- built-in formats ---------------------------------------------------------
# Each maker returns the records of one episode without metadata: a single one at
# episode granularity, one per decision (in order) at step granularity.

Maker = Callable[[Episode], list[Record]]


def _first_agent_step(spans: list[tuple[int, int]], steps: list[Step]) -> int:
    return spans[0][0] if spans else len(steps)


def text_records(episode: Episode, per_step: bool, separator: str = "") -> list[Record]:
    """Text records; each completion starts with ``separator`` (trainers join prompt
    and completion as they are)."""
    if episode.tokens is not None:
        return tokens.text_records(episode, per_step, separator)
    texts = [step_text(s) for s in episode.steps]
    base = prompt_text(episode.prompt)
    spans = decisions(episode.steps)
    if not per_step:
        lead = _first_agent_step(spans, episode.steps)
        spans = [(lead, len(texts))]
    records = []
    for start, end in spans:
        completion = _join(texts[start:end])
        if completion:
            prompt = _join([base, *texts[:start]])
            records.append({"prompt": prompt, "completion": separator + completion})
    return records


def conversational_records(episode: Episode, per_step: bool) -> list[Record]:
    if episode.tokens is not None:
        return tokens.conversation_records(episode, per_step)
    steps = episode.steps
    spans = decisions(steps)
    if not per_step:
        spans = [(_first_agent_step(spans, steps), len(steps))]
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
    steps = [_step_record(s) for s in episode.steps]
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
    return _json_text(value)


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


def _builtin_maker(settings: FormatSettings) -> Maker:
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


def load_custom(spec: str) -> CustomFormatter:
    """A custom formatter by ``package.module:function`` path or entry-point name."""
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
        try:
            target: Any = import_module(module_name)
            for part in attr.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"cannot load formatter {spec!r}: {exc}") from None
    else:
        found = metadata.entry_points(group=ENTRY_POINT_GROUP, name=spec)
        if not found:
            known = sorted(ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP))
            raise ConfigError(
                f"unknown format {spec!r}: not one of {', '.join(BUILTIN_FORMATS)}, not a "
                f"'package.module:function' path, and no {ENTRY_POINT_GROUP} entry point "
                f"(registered: {', '.join(known) or 'none'})"
            )
        try:
            target = next(iter(found)).load()
        except Exception as exc:
            raise ConfigError(f"cannot load formatter entry point {spec!r}: {exc}") from None
    if not callable(target):
        raise ConfigError(f"formatter {spec!r} is not callable")
    custom: CustomFormatter = target
    return custom


def _custom_maker(function: CustomFormatter) -> Maker:
    def make(episode: Episode) -> list[Record]:
        result = function(episode)
        if result is None:
            return []
        if isinstance(result, dict):
            return [result]
        if isinstance(result, list) and all(isinstance(r, dict) for r in result):
            return result
        raise FormatError(
            f"returned {type(result).__name__}; expected a dict, a list of dicts or None"
        )

    return make


def _summary(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _MAX_SUMMARY else text[: _MAX_SUMMARY - 3] + "..."


# -- the sink's entry point ---------------------------------------------------


def build(settings: FormatSettings, metrics: Metrics) -> Formatter:
    """The formatter for ``settings``; raises ConfigError for an unusable setting.

    Filtered episodes (and episodes a format has nothing to write for: reason
    "empty" for a built-in format without agent steps, "custom" when a custom
    formatter returns None or []) are counted in ``metrics.episodes_filtered``.
    Any failure while formatting raises FormatError with a short summary.
    """
    name = settings.format
    keep = filters.build(settings)
    make: Maker
    if name in _MAKERS:
        make = _builtin_maker(settings)
        empty = "empty"
    else:
        make = _custom_maker(load_custom(name))
        empty = "custom"
    filtered = metrics.episodes_filtered

    def format_episode(episode: Episode) -> list[bytes]:
        reason = keep(episode)
        if reason is not None:
            filtered.labels(reason).inc()
            return []
        try:
            lines = [encode(record) for record in make(episode)]
        except FormatError as exc:
            raise FormatError(f"formatter {name!r} {exc.detail}") from exc
        except Exception as exc:
            raise FormatError(f"formatter {name!r} failed: {_summary(exc)}") from exc
        if not lines:
            filtered.labels(empty).inc()
        return lines

    return format_episode
