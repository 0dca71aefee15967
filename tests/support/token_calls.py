"""Token-plane episodes for the tests: conversations of model calls, their step
events (prompts sent whole or as deltas), and an independent reference of the
segments the worker must build from them (from the full prompts, never from the
deltas), also as the ``tokens`` rows of calls given as plain dicts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from stream_export.contract.calls import (
    CallRequest,
    CallResponse,
    LlmCall,
    WeightVersion,
    version_key,
)
from stream_export.contract.events import Step

TOKENS = st.lists(st.integers(0, 40), max_size=6)
#: A prompt sent whole has a token at least (no ids at all is a text-only call).
PROMPTS = st.lists(st.integers(0, 40), min_size=1, max_size=6)


@dataclass(frozen=True)
class Call:
    """One model call as the agent saw it, and how it is sent."""

    seq: int
    prompt: list[int]
    completion: list[int]
    logprobs: list[float]
    version: WeightVersion
    #: Sent as a delta against this seq (None: whole).
    base: int | None = None
    #: Lost on the way (never reaches the worker).
    lost: bool = False

    def step(self, eid: str, calls: dict[int, Call]) -> Step:
        sent = self.prompt
        if self.base is not None:
            base = calls.get(self.base)
            skip = 0 if base is None else len(base.prompt) + len(base.completion)
            sent = self.prompt[skip:]
        call = LlmCall(
            request=CallRequest(messages=[]),
            response=CallResponse(content=f"answer {self.seq}"),
            prompt_token_ids=sent,
            completion_token_ids=self.completion,
            logprobs=self.logprobs,
            model="tiny",
            weight_version=self.version,
            finish_reason="stop",
            request_id=f"req-{self.seq}",
            prompt_base=self.base,
        )
        return Step(
            episode_id=eid, time=1000.0 + self.seq, seq=self.seq, kind="llm_call", call=call
        )


@st.composite
def conversations(draw: st.DrawFn) -> tuple[list[Call], int]:
    """Calls of one episode and its step count: each call continues the previous
    one's prompt + completion, repeats its prompt, or starts anew, with thought
    steps between; each is sent whole, as a delta against an earlier call it
    continues, or as a delta against a step that is no call; some are lost."""
    calls: list[Call] = []
    seq = -1
    for _ in range(draw(st.integers(0, 7))):
        seq += draw(st.integers(1, 3))  # the seqs skipped are thought steps
        how = draw(st.sampled_from(["continue", "repeat", "fresh"])) if calls else "fresh"
        prev = calls[-1] if calls else None
        if prev is not None and how == "continue":
            prompt = prev.prompt + prev.completion + draw(TOKENS)
        elif prev is not None and how == "repeat":
            prompt = list(prev.prompt)
        else:
            prompt = draw(PROMPTS)
        completion = draw(TOKENS)
        logprobs = [-draw(st.floats(0, 20)) for _ in completion]
        version = draw(st.integers(0, 4) | st.sampled_from(["3", "v1", "v2"]))
        bases = [c.seq for c in calls if _continues(prompt, c)]
        send = draw(st.sampled_from(["whole", "no_call", *(["delta"] if bases else [])]))
        thoughts = [s for s in range(seq) if s not in {c.seq for c in calls}]
        base: int | None = None
        if send == "delta":
            base = draw(st.sampled_from(bases))
        elif send == "no_call" and thoughts:
            base = draw(st.sampled_from(thoughts))
        lost = draw(st.integers(0, 9)) == 0
        calls.append(Call(seq, prompt, completion, logprobs, version, base, lost))
    return calls, seq + 1 + draw(st.integers(0, 2))


def _continues(prompt: list[int], call: Call) -> bool:
    done = call.prompt + call.completion
    return prompt[: len(done)] == done


def episode_steps(eid: str, calls: list[Call], steps: int) -> list[Step]:
    """The steps that reach the worker, in seq order: the calls not lost and a thought
    at every other seq below ``steps``."""
    by_seq = {c.seq: c for c in calls}
    out = []
    for seq in range(steps):
        call = by_seq.get(seq)
        if call is None:
            out.append(Step(episode_id=eid, time=1000.0 + seq, seq=seq, kind="thought"))
        elif not call.lost:
            out.append(call.step(eid, by_seq))
    return out


@dataclass(frozen=True)
class Expected:
    """What the worker must make of the calls: per segment its calls' seqs, tokens,
    logprobs and break reason; and the calls it must leave out."""

    segments: list[dict[str, Any]]
    base_missing: list[int]


def expected(calls: list[Call]) -> Expected:
    """The reference: bases resolved by seq among calls that arrived, segments cut
    wherever a full prompt does not start with the previous call's prompt + completion."""
    ok: dict[int, Call] = {}
    missing = []
    for call in calls:
        if call.lost:
            continue
        if call.base is not None and call.base not in ok:
            missing.append(call.seq)
        else:
            ok[call.seq] = call
    segments: list[dict[str, Any]] = []
    prev: Call | None = None
    for call in ok.values():
        if prev is None or not _continues(call.prompt, prev):
            reason = None
            if prev is not None:
                reason = "repeated_prompt" if call.prompt == prev.prompt else "prefix_mismatch"
            segments.append({"seqs": [], "logprobs": [], "reason": reason, "versions": []})
        seg = segments[-1]
        seg["seqs"].append(call.seq)
        seg["input_ids"] = call.prompt + call.completion
        seg["logprobs"] += call.logprobs
        seg["versions"].append(call.version)
        seg["sampled"] = [*seg.get("sampled", []), (len(call.prompt), call.completion)]
        prev = call
    for seg in segments:
        seg["min"] = min(seg["versions"], key=version_key)
        seg["max"] = max(seg["versions"], key=version_key)
    return Expected(segments, missing)


Row = dict[str, Any]


def reference(eid: str, calls: list[dict[str, Any]]) -> list[Row]:
    """The rows the calls make: a call whose full prompt starts with the previous
    call's prompt + completion continues its row, any other starts the next one."""
    rows: list[Row] = []
    prev: dict[str, Any] | None = None
    for c in calls:
        done = prev["prompt"] + prev["completion"] if prev is not None else None
        if done is None or c["prompt"][: len(done)] != done:
            row: Row = {"input_ids": [], "loss_mask": [], "logprobs": [], "versions": []}
            row.update(prompt_len=len(c["prompt"]), call_starts=[], call_ends=[])
            rows.append(row)
        row = rows[-1]
        added = c["prompt"][len(row["input_ids"]) :]
        row["input_ids"] += added + c["completion"]
        row["loss_mask"] += [0] * len(added) + [1] * len(c["completion"])
        row["logprobs"] += [0.0] * len(added) + c["lp"]
        row["versions"].append(c["v"])
        row["call_starts"].append(len(c["prompt"]))
        row["call_ends"].append(len(row["input_ids"]))
        prev = c
    for i, row in enumerate(rows):
        versions = row.pop("versions")
        row.update(weight_version_min=min(versions), weight_version_max=max(versions))
        row["call_weight_versions"] = versions
        row.update(episode_id=eid, segment=i, reward=float(len(calls)), outcome="success")
        row["group_id"] = ""
    return rows
