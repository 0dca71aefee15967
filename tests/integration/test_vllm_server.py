"""The vLLM test server (dev/vllm) gives what the gateway relies on: prompt and
completion token ids with per-token logprobs, non-streaming and streaming, equal to
a transformers forward pass of the same model; completions; named and required tool
calls through the hermes parser; the same tokens for the same seed; a model that
builds to the same bytes every time."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from tests.support.vllm_server import WEATHER, Json, VllmServer

pytestmark = pytest.mark.integration

# fp32 on both sides; ~1 ulp at the magnitude of these logprobs (about -7).
TOLERANCE = 5e-7


def chat(server: VllmServer, content: str, **more: object) -> Json:
    """A chat request asking for token ids and logprobs (the random model rarely stops
    by itself, hence max_tokens)."""
    return {
        "model": server.model,
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": content},
        ],
        "max_tokens": 24,
        "logprobs": True,
        "return_token_ids": True,
        **more,
    }


def assert_close(got: list[float], want: list[float]) -> None:
    assert len(got) == len(want)
    worst = max(abs(g - w) for g, w in zip(got, want, strict=True))
    assert worst <= TOLERANCE, f"vLLM {got} vs transformers {want}"


def test_chat_gives_token_ids_and_the_models_logprobs(vllm_server: VllmServer) -> None:
    answer = vllm_server.post("/v1/chat/completions", chat(vllm_server, "Weather?", seed=5))
    (choice,) = answer["choices"]
    prompt, completion = answer["prompt_token_ids"], choice["token_ids"]
    logprobs = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    assert len(prompt) > 10  # the system and user turns in the ChatML template
    assert len(completion) == len(logprobs) == answer["usage"]["completion_tokens"] == 24
    assert choice["finish_reason"] == "length"
    (reference,) = vllm_server.reference_logprobs([(prompt, completion)])
    assert_close(logprobs, reference)


def test_streamed_chat_gives_the_same_ids_and_logprobs_per_chunk(
    vllm_server: VllmServer,
) -> None:
    body = chat(vllm_server, "Weather today?", seed=9)
    whole = vllm_server.post("/v1/chat/completions", body)
    usage = {"stream_options": {"include_usage": True}}
    chunks = vllm_server.stream("/v1/chat/completions", {**body, **usage})
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    pieces = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0].get("token_ids")]
    assert len(pieces) > 1  # really streamed, not one chunk
    for piece in pieces:  # each chunk carries its own tokens' ids and logprobs
        assert len(piece["token_ids"]) == len(piece["logprobs"]["content"])
    (choice,) = whole["choices"]
    assert [i for p in pieces for i in p["token_ids"]] == choice["token_ids"]
    streamed = [e["logprob"] for p in pieces for e in p["logprobs"]["content"]]
    assert streamed == [e["logprob"] for e in choice["logprobs"]["content"]]
    assert "".join(p["delta"].get("content") or "" for p in pieces) == choice["message"]["content"]
    assert chunks[-1]["usage"]["completion_tokens"] == len(choice["token_ids"])


def test_completions_give_token_ids_and_the_models_logprobs(vllm_server: VllmServer) -> None:
    answer = vllm_server.post(
        "/v1/completions",
        {
            "model": vllm_server.model,
            "prompt": "The weather in paris is",
            "max_tokens": 16,
            "logprobs": 1,
            "return_token_ids": True,
            "seed": 3,
        },
    )
    (choice,) = answer["choices"]
    prompt, completion = choice["prompt_token_ids"], choice["token_ids"]
    assert len(prompt) == answer["usage"]["prompt_tokens"] > 0
    assert len(completion) == 16
    assert len(choice["logprobs"]["tokens"]) == 16
    (reference,) = vllm_server.reference_logprobs([(prompt, completion)])
    assert_close(choice["logprobs"]["token_logprobs"], reference)


@pytest.mark.parametrize(
    ("tool_choice", "finish_reason"),
    [
        ({"type": "function", "function": {"name": "get_weather"}}, "stop"),
        ("required", "tool_calls"),
    ],
    ids=["named", "required"],
)
def test_tool_calls_come_back_parsed(
    vllm_server: VllmServer, tool_choice: object, finish_reason: str
) -> None:
    body = chat(vllm_server, "Weather in paris?", max_tokens=64, seed=1)
    answer = vllm_server.post(
        "/v1/chat/completions", {**body, "tools": [WEATHER], "tool_choice": tool_choice}
    )
    (choice,) = answer["choices"]
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"]
    assert call["function"]["name"] == "get_weather"
    arguments = json.loads(call["function"]["arguments"])
    assert set(arguments) == {"city", "days"}
    assert arguments["city"] in {"paris", "oslo", "lima"} and 1 <= arguments["days"] <= 7
    assert choice["finish_reason"] == finish_reason
    assert choice["token_ids"]  # the call's own tokens, for the training record


def test_same_seed_same_tokens(vllm_server: VllmServer) -> None:
    def tokens(seed: int) -> list[int]:
        answer = vllm_server.post("/v1/chat/completions", chat(vllm_server, "Go.", seed=seed))
        ids: list[int] = answer["choices"][0]["token_ids"]
        return ids

    first = tokens(11)
    assert tokens(11) == first
    assert tokens(12) != first  # the seed, not a cache, decides


def test_the_model_builds_to_the_same_bytes(vllm_server: VllmServer, tmp_path: Path) -> None:
    again = tmp_path / "model"
    built = subprocess.run(
        [str(vllm_server.python), str(vllm_server.builder), "build", str(again)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert built.returncode == 0, built.stderr
    served = digests(vllm_server.model_dir)
    assert {"model.safetensors", "tokenizer.json", "config.json"} <= set(served)
    assert digests(again) == served


def digests(folder: Path) -> dict[str, str]:
    """sha256 of each file in ``folder`` (not dev/vllm's marker files)."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in folder.iterdir()
        if not p.name.startswith(".")
    }
