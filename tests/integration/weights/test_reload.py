"""A real weight update behind the fence: the test's own vLLM (dev mode) gets new
weights without a restart, and the logprobs the gateway recorded prove which
weights served each call: those before the commit equal a transformers pass over
the old weights, those after it a pass over the new ones (within 1e-5), for the
very same prompt (the prefix cache was reset). A checkpoint whose header does not
match the served model is refused before vLLM is touched: the fence is aborted,
vLLM is not paused and still serves the new weights. A checkpoint whose header
passes but whose file vLLM fails to load restarts vLLM behind the fence (the
session's dev-mode server, at the same URL) on the last good weights: the live loop's
trainer (``--vllm-restart``) does it, ends, and once started again serves the new
version without training its batch twice."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import aiohttp
import msgspec
import pytest

from stream_export import settings as config
from stream_export.contract.calls import LlmCall
from stream_export.contract.groups import GroupRecord
from stream_export.contract.topics import topic_names
from stream_export.errors import WeightLoadError
from stream_export.kafka import topics
from stream_export.learn.command import trainer_command
from stream_export.learn.trainer import EXIT_VLLM_RESTARTED
from stream_export.settings import Settings
from stream_export.weights import WeightFence, vllm
from tests.support.checkpoints import perturbed, reshaped
from tests.support.group_records import demo_groups
from tests.support.processes import settings_args, trainer_pythons
from tests.support.producer import produce
from tests.support.vllm_server import VllmServer
from tests.support.waiting import wait_for
from tests.support.weight_fleet import Replica, call, recorded_calls, replica_settings

pytestmark = pytest.mark.integration
TOLERANCE = 1e-5


async def test_logprobs_after_the_commit_are_the_new_weights_and_before_it_the_old(
    reloadable_vllm: VllmServer, kafka_bootstrap: str, tmp_path: Path
) -> None:
    settings = replica_settings(reloadable_vllm.url, kafka_bootstrap, tmp_path / "gateway")
    new = perturbed(reloadable_vllm.model_dir, tmp_path / "v2", seed=2)
    bad = reshaped(reloadable_vllm.model_dir, tmp_path / "bad")
    gateway = Replica("r", settings, tmp_path / "gateway.log").start()
    model = reloadable_vllm.model
    try:
        async with WeightFence(settings) as fence, aiohttp.ClientSession() as http:
            await fence.begin(1)
            await fence.commit(1)
            old_call = await call(http, gateway, model, max_tokens=8)
            async with fence.update(2):
                loaded = await vllm.load(reloadable_vllm.url, new, 2)
            new_call = await call(http, gateway, model, max_tokens=8)
            with pytest.raises(WeightLoadError) as refused:
                async with fence.update(3):
                    await vllm.load(reloadable_vllm.url, bad, 3)
            assert refused.value.reason == "checkpoint_mismatch"
            assert "lm_head.weight" in refused.value.detail
            assert await fence.serving() == 2  # aborted: nothing was loaded
            assert not _get(reloadable_vllm.url + "/is_paused")["is_paused"]
            still_new = await call(http, gateway, model, max_tokens=8)
    finally:
        assert gateway.process is not None
        gateway.process.stop()

    assert set(loaded.seconds) == {"check", "pause", "reload", "reset", "version", "resume"}
    answers = [old_call, new_call, still_new]
    assert [a.status for a in answers] == [200, 200, 200]
    calls = await asyncio.to_thread(recorded_calls, settings, [a.episode_id for a in answers])
    first, second, third = calls.values()
    assert [c.weight_version for c in (first, second, third)] == [1, 2, 2]
    old_server, new_server = reloadable_vllm, dataclasses.replace(reloadable_vllm, model_dir=new)
    old_ref, new_ref = await asyncio.gather(  # two processes at once: torch loads in seconds
        asyncio.to_thread(old_server.reference_logprobs, _asks(first, second)),
        asyncio.to_thread(new_server.reference_logprobs, _asks(second, third)),
    )
    assert _off(first.logprobs, old_ref[0]) < TOLERANCE
    assert _off(second.logprobs, new_ref[0]) < TOLERANCE
    assert _off(third.logprobs, new_ref[1]) < TOLERANCE
    assert _off(second.logprobs, old_ref[1]) > 0.1, "the weights did not change"


async def test_a_failed_reload_restarts_vllm_behind_the_fence_on_the_last_good_weights(
    reloadable_vllm: VllmServer, kafka_bootstrap: str, tmp_path: Path
) -> None:
    assert reloadable_vllm.restart, "the session's dev-mode vLLM has no restart command"
    # a call held through a restart (tens of seconds on a busy machine) stays held
    settings = replica_settings(
        reloadable_vllm.url,
        kafka_bootstrap,
        tmp_path / "gateway",
        "weights.max_hold_s=900",
        f"worker.app_id=a-{uuid.uuid4().hex[:10]}",
        "groups.enabled=true",  # the trainer's feed reads the groups topic
    )
    # the loop trainer's state after a step that made version 4 (its checkpoint and
    # ledger entry written, its batch not acknowledged); vLLM fails to load version 4
    state = tmp_path / "learn"
    good = perturbed(reloadable_vllm.model_dir, state / "weights" / "v2", seed=2)
    broken = perturbed(reloadable_vllm.model_dir, state / "weights" / "v4", seed=3, trailing=64)
    batch = demo_groups(1)
    await asyncio.to_thread(
        _trained, reloadable_vllm, state, {2: ["before"], 4: [batch[0].record_id]}
    )
    ledger = (state / "ledger.jsonl").read_text()
    restart = vllm.Restart(reloadable_vllm.restart, good, 2)
    started = _start_time(reloadable_vllm)
    gateway = Replica("r", settings, tmp_path / "gateway.log").start()
    model = reloadable_vllm.model
    try:
        async with WeightFence(settings) as fence, aiohttp.ClientSession() as http:
            async with fence.update(2):
                await vllm.load(reloadable_vllm.url, good, 2, restart=restart)
            with pytest.raises(WeightLoadError) as not_restarted:
                async with fence.update(3):
                    held = asyncio.create_task(call(http, gateway, model, max_tokens=8))
                    await asyncio.to_thread(
                        gateway.wait_metric,
                        'stream_export_gateway_fence_calls_total{outcome="held"}',
                        bool,
                    )
                    cannot = dataclasses.replace(restart, command=["false"])
                    await vllm.load(reloadable_vllm.url, broken, 3, restart=cannot)
            assert not_restarted.value.reason == "reload_failed"
            assert "restart (false) failed: exit 1" in not_restarted.value.detail
            assert fence.topic.state.open_fence is not None, "the fence must stay closed"
            assert not held.done()
            # the trainer replaces the fence left open with its own for version 4, whose
            # reload fails: it restarts vLLM on version 2 (its checkpoint v2) and ends
            first = await _trainer(reloadable_vllm, settings, state, tmp_path / "first.log")
            assert await asyncio.wait_for(first.wait(), 300) == EXIT_VLLM_RESTARTED, _tail(
                tmp_path / "first.log"
            )
            assert await fence.serving() == 2  # aborted: version 2 serves again
            during = await asyncio.wait_for(held, 60)
            after = await call(http, gateway, model, max_tokens=8)
            restarted_at = _start_time(reloadable_vllm)
            for failed in (3, 4):
                counted = f'stream_export_gateway_version_calls_total{{version="{failed}"}}'
                assert gateway.metric(counted) is None, f"a call was recorded under {failed}"
            # started again (as `stream-export learn` does) once the fault is gone, it
            # serves version 4 and leaves out the batch delivered again
            await asyncio.to_thread(_publish, settings, batch)
            with (broken / "model.safetensors").open("r+b") as file:
                file.truncate(file.seek(0, os.SEEK_END) - 64)
            again = await _trainer(reloadable_vllm, settings, state, tmp_path / "again.log")
            try:
                line = await asyncio.to_thread(_step_line, again, tmp_path / "again.log")
            finally:
                again.kill()
                await again.wait()
            assert await fence.serving() == 4
    finally:
        assert gateway.process is not None
        gateway.process.stop()

    log = (tmp_path / "first.log").read_text()
    assert "not fully covered" in log, log[-3000:]  # safetensors' own refusal
    assert "serves" in log and "as version 2 again" in log, log[-3000:]
    assert restarted_at > started, "vLLM was not restarted"
    assert _get(reloadable_vllm.url + "/weight_info") == {"weight_version": "4"}
    assert line["version"] == 4 and line["groups"] == 1 and line["fresh"] == 0, line
    # nothing trained twice: the ledger is as the step that made version 4 left it
    assert (state / "ledger.jsonl").read_text() == ledger
    assert [during.status, after.status] == [200, 200]
    calls = await asyncio.to_thread(recorded_calls, settings, [during.episode_id, after.episode_id])
    assert [c.weight_version for c in calls.values()] == [2, 2]
    served, started_on = dataclasses.replace(reloadable_vllm, model_dir=good), reloadable_vllm
    good_ref, first_ref = await asyncio.gather(
        asyncio.to_thread(served.reference_logprobs, _asks(*calls.values())),
        asyncio.to_thread(started_on.reference_logprobs, _asks(*calls.values())),
    )
    for recorded, reference, other in zip(calls.values(), good_ref, first_ref, strict=True):
        assert _off(recorded.logprobs, reference) < TOLERANCE
        assert _off(recorded.logprobs, other) > 0.1, "served by the weights vLLM started with"


#: Saves a fresh optimizer's state for the tiny model (in the trainers environment).
OPTIMIZER = (
    "import sys, torch; sys.path.insert(0, sys.argv[1]); sys.path.append(sys.argv[2]); "
    "from stream_export.trainers import llama; "
    "from stream_export.trainers.reference import ReferenceTrainer; "
    "saved = ReferenceTrainer(llama.load(sys.argv[3], torch.float32)).optimizer.state_dict(); "
    "[torch.save(saved, path) for path in sys.argv[4:]]"
)


def _trained(server: VllmServer, state: Path, records: dict[int, list[str]]) -> None:
    """Checkpoints whole as the loop trainer leaves them (weights, optimizer,
    ``trained.json``) and its ledger, for the versions in ``records``."""
    entries = [
        {"version": v, "records": r, "stepped": True, "staleness": 0, "rollouts": []}
        for v, r in records.items()
    ]
    folders = [state / "weights" / f"v{v}" for v in records]
    python, _, _, root, site = trainer_command(trainer_pythons()["trainers"], [])
    made = subprocess.run(
        [python, "-c", OPTIMIZER, root, site, str(server.model_dir)]
        + [str(f / "optimizer.pt") for f in folders],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    for folder, entry in zip(folders, entries, strict=True):
        (folder / "trained.json").write_text(json.dumps(entry))
    (state / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))


async def _trainer(
    server: VllmServer, settings: Settings, state: Path, log: Path
) -> asyncio.subprocess.Process:
    """The loop's trainer (python -m stream_export.learn.trainer in the trainers
    environment) on ``state``, its output in ``log``."""
    args = [
        *("--model", str(server.model_dir), "--vllm", server.url, "--state-dir", str(state)),
        *("--vllm-restart", shlex.join(server.restart), "--groups-per-step", "1"),
        *("--feed-group", f"trainer-{uuid.uuid4().hex[:10]}", "--max-steps", "9"),
        *settings_args(settings),
    ]
    pythons = await asyncio.to_thread(trainer_pythons)
    command = trainer_command(pythons["trainers"], args)
    with log.open("wb") as out:
        return await asyncio.create_subprocess_exec(*command, stdout=out, stderr=out)


def _publish(settings: Settings, records: list[GroupRecord]) -> None:
    """``records`` on the groups topic the trainer's feed reads (not acknowledged)."""
    asyncio.run(topics.ensure(settings))
    name = topic_names(settings.worker.app_id)[1]
    messages = [(b"g", msgspec.json.encode(r)) for r in records]
    asyncio.run(produce(settings.kafka.bootstrap_servers, name, messages))


def _step_line(process: asyncio.subprocess.Process, log: Path) -> dict[str, object]:
    """The trainer's first step line (it printed it once its batch was acknowledged)."""

    def found() -> dict[str, object] | None:
        lines = log.read_text(errors="replace").splitlines()
        steps = [json.loads(x) for x in lines if x.startswith('{"waited_s"') and x.endswith("}")]
        return steps[0] if steps else None

    wait_for(
        lambda: process.returncode is not None or found(), timeout=120, what=lambda: _tail(log)
    )
    line = found()
    assert line is not None, _tail(log)
    return line


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def _start_time(server: VllmServer) -> float:
    """When the vLLM process started (its Prometheus process_start_time_seconds)."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found = re.search(r"^process_start_time_seconds (\S+)$", text, flags=re.M)
    assert found, text[:2000]
    return float(found.group(1))


def _snippet() -> str:
    """The runnable trainer script of docs/weights.md (its one python block)."""
    page = (Path(__file__).resolve().parents[3] / "docs" / "weights.md").read_text()
    return page.split("```python\n", 1)[1].split("```", 1)[0]


def _asks(*calls: LlmCall) -> list[tuple[list[int], list[int]]]:
    return [(list(c.prompt_token_ids), list(c.completion_token_ids)) for c in calls]


def _off(recorded: list[float], reference: list[float]) -> float:
    assert len(recorded) == len(reference) > 0
    return max(abs(a - b) for a, b in zip(recorded, reference, strict=True))


def _get(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        found: dict[str, object] = json.load(answer)
    return found


async def test_the_docs_snippet_loads_a_checkpoint_behind_the_fence(
    reloadable_vllm: VllmServer, kafka_bootstrap: str, tmp_path: Path
) -> None:
    snippet = _snippet()
    topic = f"t-{uuid.uuid4().hex[:10]}-weights"
    checkpoint = perturbed(reloadable_vllm.model_dir, tmp_path / "v7", seed=7)
    env = {
        **os.environ,
        "STREAM_EXPORT_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "STREAM_EXPORT_WEIGHTS_CONTROL_TOPIC": topic,
        "VLLM_URL": reloadable_vllm.url,
        "CHECKPOINT": str(checkpoint),
        "VERSION": "7",
    }
    ran = await asyncio.create_subprocess_exec(
        sys.executable, "-c", snippet, env=env, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await asyncio.wait_for(ran.communicate(), 120)
    assert ran.returncode == 0, stderr.decode()
    settings = config.load(
        env={},
        overrides=[f"kafka.bootstrap_servers={kafka_bootstrap}", f"weights.control_topic={topic}"],
    )
    async with WeightFence(settings) as fence:
        assert await fence.serving() == 7
    assert _get(reloadable_vllm.url + "/weight_info") == {"weight_version": "7"}
