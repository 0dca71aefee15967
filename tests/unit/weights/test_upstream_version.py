"""An upstream that reports its own weight version (SGLang: ``weight_version`` at the
top level or in ``metadata``) wins over the fence's stamp; chunks that report
several keep the oldest; a version that is no WeightVersion is the upstream's error."""

from __future__ import annotations

from typing import Any

import pytest

from stream_export.errors import UpstreamError
from stream_export.gateway.mapping import StreamGather, sampled


def answer(**extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "model": "tiny",
        "prompt_token_ids": [1, 2],
        "choices": [
            {
                "message": {"role": "assistant", "content": "hi"},
                "token_ids": [3],
                "logprobs": {"content": [{"logprob": -0.5}]},
                "finish_reason": "stop",
            }
        ],
        **extra,
    }


def test_a_whole_answers_version_is_read_from_the_top_level_or_its_metadata() -> None:
    assert sampled("chat", answer()).weight_version is None
    assert sampled("chat", answer(weight_version=7)).weight_version == 7
    assert sampled("chat", answer(metadata={"weight_version": "12"})).weight_version == "12"


def test_a_stream_that_reports_several_versions_keeps_the_oldest() -> None:
    gather = StreamGather("chat")
    for version in (5, 3, "4"):
        gather.feed({"choices": [], "weight_version": version})
    assert gather.result().weight_version == 3


@pytest.mark.parametrize("bad", [[1], {"v": 1}, "x" * 257, 2**63, 1.5])
def test_a_version_that_is_no_weight_version_is_the_upstreams_error(bad: Any) -> None:
    with pytest.raises(UpstreamError):
        sampled("chat", answer(weight_version=bad))
