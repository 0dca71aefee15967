"""The group judge's pure part: the request it is sent, reading its answer, and what
its verdict does to a closed group (``groups.judge_url``; the I/O is in
:mod:`.judging`).

**The request** (``POST {judge_url}/chat/completions``, temperature 0): a system
message (:data:`SYSTEM`) and a user message holding the task prompt, then each
judged rollout's completion text (as the ``text`` format writes it) numbered from 1,
each cut to ``groups.judge_max_chars`` characters (its start and end, ``[...]``
between; the prompt too), so a group of large rollouts makes a bounded request. Its
``response_format`` is a JSON schema: an object with exactly the properties "1" to
"N", each an integer from 0 to 10, which a server with structured outputs (vLLM's
xgrammar) enforces. An answer that is not that is a failed attempt
(:class:`~stream_export.errors.JudgeError`). A rollout's score is the integer / 10.

**The verdict** (:class:`Verdict`) is what one judging of a group found: each judged
rollout's score, or none (the judge failed every attempt). It is sent on the
repartition topic to the group's partition, and the groups stage applies the first
verdict for a group being judged (:meth:`~.state.GroupBook.judged`): each judged
rollout gets the score in ``rewards[judge_name]`` and ``scores``, and its reward is
computed again (``scores.reward`` over its scores; without an expression the
judge's score is the reward); a failed verdict names ``judge_name`` in the rollouts'
``scores_missing`` instead. Truncated rollouts are not judged.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

import msgspec

from stream_export.assemble.scoring import with_late
from stream_export.contract.decoding import decode_as, decode_episode, encode
from stream_export.contract.episode import Episode
from stream_export.contract.events import MAX_ID_LENGTH, Evaluator, Score
from stream_export.contract.scores import record_of
from stream_export.errors import JudgeError
from stream_export.groups.state import OpenGroup, member_of
from stream_export.rows.episode import prompt_text
from stream_export.rows.formats import text_records
from stream_export.settings import Settings

#: The header that marks a verdict on the repartition topic.
VERDICT_HEADER: Final = "x-stream-export-verdict"
#: The highest score the judge may give (a score's value is the integer / this).
TOP: Final = 10
CUT: Final = "[...]"
SYSTEM: Final = (
    "You are a strict judge. You see one task and several attempts at it, numbered. "
    f"Score each attempt from 0 (wrong or useless) to {TOP} (correct and complete), "
    "comparing them with each other. Answer only with a JSON object that maps each "
    "attempt's number to its score."
)


class Verdict(msgspec.Struct, kw_only=True):
    """One judging of a group: ``scores`` by episode id (0 to 1), or None when the
    judge failed ``attempts`` times (``error``: the last failure)."""

    group_id: str
    #: When it was judged (the time of the score events it makes).
    time: float
    scores: dict[str, float] | None
    attempts: int
    error: str = ""


_verdict_decoder: Final = msgspec.json.Decoder(Verdict)


def decode_verdict(data: bytes | None) -> Verdict:
    return decode_as(_verdict_decoder, data, "verdict")


def cut(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters: its start and end with ``[...]`` between."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - len(CUT))
    return text[: keep - keep // 2] + CUT + text[len(text) - keep // 2 :]


def judged_members(group: OpenGroup) -> list[int]:
    """Which members the judge sees (by index): the scored ones (not truncated)."""
    return [i for i, m in enumerate(group.members) if not m.truncated]


def completion_text(episode: Episode) -> str:
    texts = text_records(episode, False)
    return str(texts[0]["completion"]).strip() if texts else ""


def request(prompt: str, completions: list[str], settings: Settings) -> dict[str, Any]:
    """The chat completions request that asks for one score per completion."""
    g = settings.groups
    parts = [f"Task:\n{cut(prompt, g.judge_max_chars)}"]
    parts += [
        f"Attempt {i}:\n{cut(text, g.judge_max_chars)}" for i, text in enumerate(completions, 1)
    ]
    parts.append(f"Score each of the {len(completions)} attempts from 0 to {TOP}.")
    return {
        "model": g.judge_model,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "\n\n".join(parts)},
        ],
        "temperature": 0,
        # a property is at most `"100000":10,` (a few tokens each), and the braces
        "max_tokens": 16 + 12 * len(completions),
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "scores", "strict": True, "schema": schema(len(completions))},
        },
    }


def group_request(group: OpenGroup, settings: Settings) -> tuple[list[str], dict[str, Any]]:
    """The episode ids the judge scores (in order) and the request for ``group``."""
    episodes = [decode_episode(group.members[i].record) for i in judged_members(group)]
    prompt = prompt_text(episodes[0].prompt) if episodes else ""
    body = request(prompt, [completion_text(e) for e in episodes], settings)
    return [e.episode_id for e in episodes], body


def schema(n: int) -> dict[str, Any]:
    """The JSON schema of an answer for ``n`` completions."""
    names = [str(i) for i in range(1, n + 1)]
    return {
        "type": "object",
        "properties": {name: {"type": "integer", "enum": list(range(TOP + 1))} for name in names},
        "required": names,
        "additionalProperties": False,
    }


class _Message(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    message: _Message


class _Answer(msgspec.Struct):
    choices: list[_Choice]


_answer: Final = msgspec.json.Decoder(_Answer)
_scores: Final = msgspec.json.Decoder(dict[str, int])


def parse(body: bytes, n: int) -> list[float]:
    """The ``n`` scores (0 to 1) of a chat completions answer, or JudgeError."""
    try:
        choices = _answer.decode(body).choices
        content = choices[0].message.content if choices else None
        found = _scores.decode(content or "")
    except msgspec.MsgspecError as exc:
        raise JudgeError(f"the judge's answer is not the JSON asked for: {exc}") from None
    names = [str(i) for i in range(1, n + 1)]
    if sorted(found) != sorted(names):
        raise JudgeError(f"the judge scored {sorted(found)[:20]}, not the attempts 1 to {n}")
    if any(type(found[k]) is not int or not 0 <= found[k] <= TOP for k in names):
        raise JudgeError(f"the judge gave a score outside 0 to {TOP}")
    return [found[k] / TOP for k in names]


def score_id(model: str, record_id: str, episode_id: str) -> str:
    """The judge's score id of one rollout: ``<model>:<record id>:<episode id>``, or
    a digest of the two ids where that would be longer than an id may be."""
    text = f"{model}:{record_id}:{episode_id}"
    if len(text) <= MAX_ID_LENGTH:
        return text
    both = msgspec.json.encode([record_id, episode_id])
    return f"{model}:{hashlib.sha256(both).hexdigest()}"


def _score(episode_id: str, value: float, verdict: Verdict, settings: Settings) -> Score:
    """The judge's ``score`` event for one rollout."""
    g = settings.groups
    return Score(
        episode_id=episode_id,
        time=verdict.time,
        score_id=score_id(g.judge_model, verdict.group_id, episode_id),
        name=g.judge_name,
        value=value,
        evaluator=Evaluator(id=g.judge_model, version=g.judge_version),
    )


def apply(
    group: OpenGroup, verdict: Verdict, settings: Settings
) -> tuple[OpenGroup, list[Episode], list[tuple[str, bytes]]]:
    """``group`` and its rollouts as the verdict leaves them (see the module doc), and
    the ``score`` events of its scores with their episode ids (their key on the steps
    topic): the scores output gets each once, by its score id."""
    name, scores = settings.groups.judge_name, verdict.scores
    members, rollouts, events = [], [], []
    for member in group.members:
        episode = decode_episode(member.record)
        value = None if scores is None else scores.get(episode.episode_id)
        if value is not None:
            score = _score(episode.episode_id, value, verdict, settings)
            events.append((episode.episode_id, encode(score)))
            episode = with_late(episode, [record_of(score)], settings.scores)
            if settings.scores.expression() is None:
                episode = msgspec.structs.replace(episode, reward=value)
            member = member_of(episode, member.record, member.source)
        elif scores is None and not member.truncated and name not in episode.scores_missing:
            episode = msgspec.structs.replace(
                episode, scores_missing=[*episode.scores_missing, name]
            )
        members.append(member)
        rollouts.append(episode)
    return msgspec.structs.replace(group, members=members), rollouts, events
