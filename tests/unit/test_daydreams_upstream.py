"""The scripted Daydreams upstream answers as the Daydreams tests expect: its XML
script, vLLM's token fields, OpenAI's refusal in strict mode, and its faults."""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest

from tests.support.daydreams_upstream import ACT, FINISH, serving

Json = dict[str, Any]
PREFILL: Json = {"role": "assistant", "content": "<response>"}


def post(url: str, body: Json) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(
            "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def chunks(raw: bytes) -> list[Json]:
    lines = [line[6:] for line in raw.splitlines() if line.startswith(b"data: ")]
    assert lines[-1] == b"[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_it_acts_until_the_prompt_shows_the_result_then_answers() -> None:
    first = [
        {"role": "user", "content": "<unprocessed-inputs>dark room</unprocessed-inputs>"},
        PREFILL,
    ]
    shown = (
        '<action_result callId="c1" name="open_door" timestamp="1">I found the door</action_result>'
    )
    with serving() as upstream:
        status, raw = post(upstream.url, {"model": "m", "messages": first, "stream": True})
        assert status == 200
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks(raw))
        assert text == ACT
        status, raw = post(
            upstream.url, {"model": "m", "messages": [{"role": "user", "content": shown}]}
        )
        assert json.loads(raw)["choices"][0]["message"]["content"] == FINISH


def test_token_ids_and_logprobs_as_vllm_gives_them() -> None:
    messages = [{"role": "user", "content": "hi"}]
    with serving() as upstream:
        body = {"model": "m", "messages": messages, "return_token_ids": True, "logprobs": True}
        whole = json.loads(post(upstream.url, body)[1])
        streamed = chunks(post(upstream.url, {**body, "stream": True})[1])
    choice = whole["choices"][0]
    assert bytes(whole["prompt_token_ids"]).decode() == "user: hi"
    assert bytes(choice["token_ids"]).decode() == ACT
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    assert streamed[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    ids = [i for c in streamed for i in c["choices"][0].get("token_ids") or []]
    logprobs = [
        e["logprob"]
        for c in streamed
        for e in (c["choices"][0].get("logprobs") or {}).get("content", [])
    ]
    assert ids == choice["token_ids"]
    assert logprobs == [e["logprob"] for e in choice["logprobs"]["content"]]


def test_strict_mode_refuses_unknown_fields_as_openai_does() -> None:
    with serving(strict=True) as upstream:
        status, raw = post(
            upstream.url,
            {"model": "m", "messages": [], "return_token_ids": True, "logprobs": True},
        )
        assert status == 400
        assert json.loads(raw)["error"] == {
            "message": "Unrecognized request argument supplied: return_token_ids",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
        status, raw = post(upstream.url, {"model": "m", "messages": [], "top_k": 1, "foo": 2})
        assert (
            json.loads(raw)["error"]["message"]
            == "Unrecognized request arguments supplied: foo, top_k"
        )
        status, raw = post(upstream.url, {"model": "m", "messages": [], "logprobs": True})
        assert status == 200
        assert "token_ids" not in json.loads(raw)["choices"][0]


@pytest.mark.parametrize("stream", [False, True])
def test_faults_null_logprobs_then_a_good_call(stream: bool) -> None:
    body = {"model": "m", "messages": [], "logprobs": True, "stream": stream}
    with serving() as upstream:
        upstream.fail_next("null_logprobs")
        upstream.fail_next("null_logprob_entries")
        answers = [post(upstream.url, body)[1] for _ in range(3)]
    parts = [chunks(a) if stream else [json.loads(a)] for a in answers]
    firsts = [p[0]["choices"][0]["logprobs"] for p in parts]
    assert firsts[0] is None
    assert {e["logprob"] for e in firsts[1]["content"]} == {None}
    assert all(isinstance(e["logprob"], float) for e in firsts[2]["content"])


def test_a_stream_that_dies_midway_has_no_end() -> None:
    with serving() as upstream:
        upstream.fail_next("die_mid_stream")
        with pytest.raises(http.client.IncompleteRead) as broken:
            post(upstream.url, {"model": "m", "messages": [], "stream": True})
        status, _ = post(upstream.url, {"model": "m", "messages": [], "stream": True})
    assert b"[DONE]" not in broken.value.partial
    assert status == 200
