"""The vLLM test server (dev/vllm) gives what the gateway relies on: prompt and
completion token ids with per-token logprobs, non-streaming and streaming, equal to
a transformers forward pass of the same model; completions; named and required tool
calls through the hermes parser; the same tokens for the same seed; a model that
builds to the same bytes every time."""

from __future__ import annotations

import hashlib
import json
import subprocess
import urllib.request
from concurrent.futures import ThreadPoolExecutor
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


def agent_prompt(steps: int, agent: int = 0) -> str:
    """A prompt shaped like an agent framework's (instructions, then every earlier step
    re-rendered as XML, as Daydreams does): ~61 of the tiny model's tokens a step."""
    words = ["agent", "step", "reward", "tool", "call", "result", "answer", "weather", "city"]
    parts = [f"<instructions>You are agent {agent}. Act with <action_call>.</instructions>"]
    for n in range(steps):
        thought = " ".join(words[(n * 7 + i) % len(words)] for i in range(24))
        result = json.dumps({"city": "oslo", "days": n % 7 + 1})
        parts.append(f'<step n="{n}"><reasoning>{thought}</reasoning>{result}</step>')
    return "\n".join(parts)


def test_prompts_of_thousands_of_tokens_are_served(vllm_server: VllmServer) -> None:
    with urllib.request.urlopen(vllm_server.url + "/v1/models", timeout=30) as listed:
        (model,) = json.load(listed)["data"]
    assert model["max_model_len"] >= 8192, "restart the server with dev/vllm of this tree"
    # Five at once (~18k tokens: more than two steps' budget of 8,192), with seeds: a
    # seeded prompt split over prefill steps would kill vLLM's engine on CPU.
    bodies = [
        chat(vllm_server, agent_prompt(60, agent), max_tokens=8, seed=2) for agent in range(5)
    ]
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(
            pool.map(lambda body: vllm_server.post("/v1/chat/completions", body), bodies)
        )
    for answer in answers:
        (choice,) = answer["choices"]
        assert 3_600 <= len(answer["prompt_token_ids"]) == answer["usage"]["prompt_tokens"] <= 3_800
        assert len(choice["token_ids"]) == 8
    # Every position of a long prompt counts: the same numbers as transformers.
    (choice,) = answers[0]["choices"]
    calls = [(answers[0]["prompt_token_ids"], choice["token_ids"])]
    (reference,) = vllm_server.reference_logprobs(calls)
    assert_close([e["logprob"] for e in choice["logprobs"]["content"]], reference)


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
