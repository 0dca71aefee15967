"""The live loop's task: where its prompts come from and how an episode is scored.

A prompt set is a file of JSON lines (``{"prompt": "..."}``, other keys kept as the
task's own) or of plain text lines; without one, the default task makes a fresh
prompt for every group (five words drawn from the tiny test model's vocabulary), so
every reward the loop measures is on a task it never trained on. A reward function
is named by import path, ``module:function``; it gets the ``Episode`` an agent played
and answers a float (or None: the episode ends without a reward, for an outside
verifier's score event). The default, ``digit_reward``, is the toy task of the design
notes: 1.0 when one of the first four completion tokens is a digit.

Pure: standard library only (the worker's environment and the trainer's both load it).
"""

from __future__ import annotations

import importlib
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from stream_export.errors import TrainerInputError

#: The default task's words (the tiny test model's vocabulary knows each one).
WORDS: Final = [
    "paris",
    "oslo",
    "tokyo",
    "lima",
    "cairo",
    "sunny",
    "rain",
    "snow",
    "wind",
    "cold",
    "warm",
    "hot",
    "today",
    "tomorrow",
    "week",
    "city",
    "weather",
    "tool",
    "answer",
    "question",
    "number",
    "value",
    "list",
    "find",
    "search",
]
DIGITS: Final = frozenset("0123456789")
DEFAULT_REWARD: Final = "stream_export.learn.tasks:digit_reward"


@dataclass(frozen=True)
class Episode:
    """What a reward function sees of one rollout."""

    #: The task's entry of the prompt set (``{"prompt": ...}`` and its own keys).
    task: dict[str, Any]
    #: The conversation the agent held, its answers included.
    messages: list[dict[str, Any]]
    #: The last answer's text.
    completion: str
    #: The last answer's sampled tokens as text, in order (from its logprobs).
    tokens: list[str] = field(default_factory=list)


Reward = Callable[[Episode], float | None]


def digit_reward(episode: Episode) -> float:
    """1.0 when one of the first four sampled tokens is a digit (``"7"``, ``" 7"``)."""
    return float(any(token.strip() in DIGITS for token in episode.tokens[:4]))


def load_reward(spec: str) -> Reward:
    """The function ``module:function`` names; TrainerInputError when there is none."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise TrainerInputError(f"a reward function is named module:function, not {spec!r}")
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as error:
        raise TrainerInputError(f"no reward function {spec!r}: {error}") from error
    if not callable(found):
        raise TrainerInputError(f"{spec!r} is not callable")
    reward: Reward = found
    return reward


def read_prompts(path: str | Path) -> list[dict[str, Any]]:
    """A prompt set's tasks: JSON lines with a string ``prompt``, or lines of text."""
    tasks = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        text = line.strip()
        if not text:
            continue
        if text.startswith("{"):
            try:
                task = json.loads(text)
            except json.JSONDecodeError as error:
                raise TrainerInputError(f"{path}:{number}: not JSON: {error}") from error
            if not isinstance(task.get("prompt"), str) or not task["prompt"]:
                raise TrainerInputError(f"{path}:{number}: no string prompt")
            tasks.append(task)
        else:
            tasks.append({"prompt": text})
    if not tasks:
        raise TrainerInputError(f"{path}: no prompt")
    return tasks


def prompts(path: str | Path | None, seed: int | None = None) -> Iterator[dict[str, Any]]:
    """Tasks without end: the prompt set's, shuffled anew on each pass, or (no path)
    a fresh five-word prompt each time."""
    rnd = random.Random(seed)
    if path is None:
        while True:
            yield {"prompt": " ".join(rnd.sample(WORDS, 5))}
    tasks = read_prompts(path)
    while True:
        yield from rnd.sample(tasks, len(tasks))
