"""verl's reward function for the rows of ``stream-export export --to FILE.parquet``.

verl's reward manager calls it once per generated response, by keyword::

    compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)

(verl 0.9: ``reward.custom_reward_function.path=pkg://stream_export.trainers.verl_reward``,
``reward.custom_reward_function.name=compute_score``). A row of ours (``data_source``
``stream-export`` or ``stream-export/<domain>``) is scored

* against its ``ground_truth`` when it has one: 1.0 when the response's final answer
  matches it (:func:`matches`), else 0.0;
* else by the reward the fleet recorded for the same text (``extra_info.completions``
  and ``extra_info.rewards``, compared with whitespace collapsed; the mean of a text
  recorded more than once).

A response of a task without a ground truth that the fleet never produced raises
:class:`~stream_export.errors.RewardError`: any number made up for it (the task's mean
reward, say) would be the same for every new response, so every GRPO advantage would
be 0 and the task would train nothing, silently. A ``data_source`` the agent chose
goes to verl's own ``default_compute_score``.

Imports only the standard library and ``stream_export.errors``, so verl's workers load
it without the worker's dependencies.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Mapping
from typing import Any, Final

from stream_export.errors import RewardError

#: The ``data_source`` of exported rows whose agent set none (never one of verl's
#: own scorer names, which would score them against their rules).
DATA_SOURCE: Final = "stream-export"

_BOXED: Final = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER: Final = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_SPACE: Final = re.compile(r"\s+")


def source_for(domain: str) -> str:
    """Our ``data_source`` for a task of ``domain`` (``""``: none)."""
    return f"{DATA_SOURCE}/{domain}" if domain else DATA_SOURCE


def is_ours(source: str) -> bool:
    return source == DATA_SOURCE or source.startswith(DATA_SOURCE + "/")


def _squash(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


def final_answer(response: str) -> str:
    """The last ``\\boxed{...}`` of a response, else what follows its last ``####``,
    else its last non-empty line."""
    boxed = _BOXED.findall(response)
    if boxed:
        return str(boxed[-1])
    if "####" in response:
        return response.rsplit("####", 1)[1]
    lines = [line for line in response.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def matches(response: str, ground_truth: str) -> bool:
    """Whether the response's final answer is the ground truth: for a number, the
    answer's last number equals it; for text, the answer holds it as a whole phrase
    (case and spacing ignored)."""
    answer, truth = final_answer(response), _squash(ground_truth)
    if _NUMBER.fullmatch(truth):
        numbers = _NUMBER.findall(answer)
        return bool(numbers) and math.isclose(_number(numbers[-1]), _number(truth), abs_tol=1e-9)
    whole = re.compile(rf"(?<!\w){re.escape(truth.casefold())}(?!\w)")
    return bool(truth) and whole.search(_squash(answer).casefold()) is not None


def recorded_reward(response: str, extra_info: Mapping[str, Any] | None) -> float | None:
    """The fleet's mean reward for this very text, None when it never produced it."""
    info = extra_info or {}
    completions, rewards = info.get("completions"), info.get("rewards")
    if completions is None or rewards is None:
        return None
    key = _squash(response)
    found = [float(r) for c, r in zip(completions, rewards, strict=True) if _squash(c) == key]
    return sum(found) / len(found) if found else None


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str | None,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> float | dict[str, Any]:
    """verl's ``compute_score``: see the module's description. verl's own scorers, for
    a ``data_source`` not ours, may answer a dict (``score`` and more), as verl allows."""
    if not is_ours(data_source):
        verl = importlib.import_module("verl.utils.reward_score")
        score: float | dict[str, Any] = verl.default_compute_score(
            data_source, solution_str, ground_truth, extra_info, **kwargs
        )
        return score
    if ground_truth:
        return 1.0 if matches(solution_str, ground_truth) else 0.0
    recorded = recorded_reward(solution_str, extra_info)
    if recorded is None:
        index = (extra_info or {}).get("index")
        raise RewardError(
            f"row {index} ({data_source}) has no ground_truth and the fleet never "
            "recorded this response; give the task a ground_truth (metadata "
            "'ground_truth' or 'answer') or score it with a reward function of your own"
        )
    return recorded
