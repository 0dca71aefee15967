"""A Daydreams agent through stream-export, end to end: the real @daydreamsai/core
(pinned in integrations/daydreams/package-lock.json) runs the dark-room agent of
integrations/daydreams/test/dark-room.ts, whose only stream-export line is the
extension, against the scripted upstream of tests/support/daydreams_upstream.py
(Daydreams' own output format), through a real gateway and worker on the real
broker. N rollouts give N records in the seed's shape, compared field by field
with tests/golden/seed.jsonl; bad input (an agent that throws, an upstream dying
mid-stream, null logprobs, a hosted API refusing the gateway's fields, an
unserved route, steps batches repeated across a kill -9) never loses an answer
and never leaves an episode to the idle timeout."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from stream_export.contract.events import EpisodeEnd, EpisodeStart, Step
from stream_export.gateway import steps
from stream_export.settings import Settings
from tests.support import daydreams_upstream as scripted
from tests.support.daydreams_upstream import DaydreamsUpstream, serving
from tests.support.gateway_agent import base, events_of, post, running, start_episode
from tests.support.monitoring import free_port, get
from tests.support.processes import Worker, export, settings_args
from tests.support.vllm_server import VllmServer
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

Json = dict[str, Any]
ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "integrations" / "daydreams"
SEED = [
    json.loads(line) for line in (ROOT / "tests" / "golden" / "seed.jsonl").read_text().splitlines()
]
ACTION_LINE = 'Action: open_door({"direction":"north"})'
#: The record every dark-room rollout gives (format.text_separator=none).
RECORD = {
    "prompt": scripted.TASK,
    "completion": "\n\n".join(
        [
            scripted.REASONING,
            ACTION_LINE,
            scripted.RESULT,
            scripted.FINAL_REASONING,
            scripted.OUTPUT,
        ]
    ),
}


@pytest.fixture(scope="session")
def dark_room() -> Path:
    """The package installed as its lock pins it (``npm ci``, again only when the lock
    changed, as dev/setup does), built with tsc, its own node:test tests passing:
    the dark-room script."""
    pinned = (PACKAGE / "package.json").read_bytes() + (PACKAGE / "package-lock.json").read_bytes()
    want = hashlib.sha256(pinned).hexdigest()
    marker = PACKAGE / "node_modules" / ".installed"
    if not marker.exists() or marker.read_text().strip() != want:
        npm("ci", "--no-audit", "--no-fund", "--loglevel=error")
        marker.write_text(want + "\n")
    core = json.loads((PACKAGE / "node_modules/@daydreamsai/core/package.json").read_text())
    assert core["version"] == "0.3.22", core["version"]
    npm("run", "build:test")  # the package and its tests (what `npm test` builds too)
    tested = run(["node", "--test", *map(str, (PACKAGE / "build-test" / "test").glob("*.test.js"))])
    assert "# fail 0" in tested, tested
    return PACKAGE / "build-test" / "test" / "dark-room.js"


def npm(*args: str) -> str:
    return run(["npm", *args])


def run(command: list[str]) -> str:
    done = subprocess.run(
        command, cwd=PACKAGE, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def rollouts(script: Path, settings: Settings, *args: str) -> list[Json]:
    """Run the dark-room agent; one line per rollout (episode_id and outcome, or error)."""
    done = subprocess.run(
        ["node", str(script), "--gateway", base(settings), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@dataclass
class Pipeline:
    settings: Settings
    upstream: DaydreamsUpstream
    tmp: Path

    def exported(self, fmt: str) -> list[Json]:
        target = self.tmp / f"export-{fmt}.jsonl"
        done = export(self.settings, "--to", str(target), "--format", fmt)
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in target.read_text().splitlines()]

    def metric(self, sample: str) -> float:
        text = get(base(self.settings) + "/metrics")[1].decode()
        line = next((x for x in text.splitlines() if x.startswith(sample + " ")), None)
        assert line is not None, f"{sample} not exposed"
        return float(line.rsplit(" ", 1)[1])


def settings_env(settings: Settings) -> dict[str, str]:
    """The STREAM_EXPORT_* variables that give a child process these settings."""
    flags = settings_args(settings)
    pairs = (flag.split("=", 1) for flag in flags[1::2])
    return {f"STREAM_EXPORT_{k.replace('.', '_').upper()}": v for k, v in pairs}


def shell(command: str, cwd: Path, env: dict[str, str]) -> str:
    """Run one of the page's commands; its output."""
    done = subprocess.run(
        command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=180,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


@contextmanager
def background(command: str, cwd: Path, env: dict[str, str]) -> Iterator[None]:
    """A page's ``command &``, stopped (its process group) when the block ends."""
    with open(cwd / "background.log", "ab") as log:
        proc = subprocess.Popen(
            command, shell=True, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        yield
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@contextmanager
def pipeline(
    settings_for: Callable[..., Settings], tmp_path: Path, *overrides: str, strict: bool = False
) -> Iterator[Pipeline]:
    """The scripted upstream, a gateway in front of it and a worker writing ``text``."""
    with ExitStack() as stack:
        upstream = stack.enter_context(serving(strict=strict))
        settings = settings_for(
            f"gateway.upstreams={upstream.url}",
            f"gateway.port={free_port()}",
            f"gateway.state_dir={tmp_path / 'gateway'}",
            "format.text_separator=none",
            "sink.flush_interval_ms=20",
            *overrides,
        )
        stack.enter_context(Worker(settings, tmp_path / "worker.log"))
        stack.enter_context(running(settings, tmp_path / "gateway.log"))
        yield Pipeline(settings, upstream, tmp_path)


def written(settings: Settings, count: int) -> list[Json]:
    """The text records the worker wrote, once there are ``count``."""
    out = Path(settings.sink.output_dir)
    lines: list[str] = []

    def enough() -> bool:
        lines[:] = [
            line for path in sorted(out.glob("*.jsonl")) for line in path.read_text().splitlines()
        ]
        return len(lines) >= count

    wait_for(enough, timeout=60, what=f"{count} records in {out}")
    return [json.loads(line) for line in lines]


def page_commands(marker: str) -> list[str]:
    """The commands of docs/daydreams.md's block after ``<!-- marker -->``, in order."""
    page = (ROOT / "docs" / "daydreams.md").read_text()
    block = page.split(f"<!-- {marker} -->\n```sh\n", 1)[1].split("```", 1)[0]
    return block.strip().splitlines()


def test_the_pages_commands_give_n_records_in_the_seeds_shape(
    settings_for: Callable[..., Settings], tmp_path: Path, dark_room: Path
) -> None:
    """docs/daydreams.md's quickstart as written (the scripted upstream for the
    model server, a free port and the test's topics): 3 rollouts, 3 records."""
    port = free_port()
    settings = settings_for(f"gateway.port={port}", "sink.flush_interval_ms=20")
    env = {**os.environ, **settings_env(settings)}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # stream-export
    (tmp_path / "integrations").symlink_to(ROOT / "integrations")
    (tmp_path / "package.json").write_text(
        '{"name": "my-agent", "private": true, "type": "module"}'
    )
    for command in page_commands("install"):  # into the agent's project (here: tmp_path)
        shell(command, tmp_path, env)
    imported = 'import("@stream-export/daydreams").then((m) => console.log(typeof m.streamExport))'
    assert shell(f"node -e '{imported}'", tmp_path, env) == "function\n"
    with serving() as upstream, ExitStack() as stack:
        for command in page_commands("quickstart"):
            command = command.replace("http://127.0.0.1:8000/v1", upstream.url)
            command = command.replace("127.0.0.1:9180", f"127.0.0.1:{port}")
            if command.endswith("&"):
                stack.enter_context(background(command[:-1], tmp_path, env))
                if " gateway " in command:
                    wait_for(lambda: get(base(settings) + "/healthz")[0] == 200, timeout=60)
                continue
            if command.startswith("stream-export export"):
                written(settings, 3)  # the worker has the episodes
            out = shell(command, tmp_path, env)
            if command.startswith("node "):
                ran = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
            if command.startswith("head "):
                assert json.loads(out) == RECORD
        pipeline = Pipeline(settings, upstream, tmp_path)
        episodes = pipeline.exported("episode")
        tokens = pipeline.exported("tokens")
    assert [r.get("outcome") for r in ran] == ["success"] * 3, ran
    records = [json.loads(x) for x in (tmp_path / "training-data.jsonl").read_text().splitlines()]
    assert records == [RECORD] * 3
    seed_result, seed_action = SEED
    for record in records:
        assert record["prompt"] == seed_result["prompt"] == seed_action["prompt"]
        reasoning, action, result, *_ = record["completion"].split("\n\n")
        assert [reasoning, result] == seed_result["completion"].split("\n\n")
        assert reasoning == seed_action["completion"].split("\n\n")[0]
        assert action.startswith("Action: ") and seed_action["completion"].endswith(
            "\n\nAction: try opening the door"
        )  # the seed's free-text action; Daydreams names its call and arguments
    assert sorted(e["episode_id"] for e in episodes) == sorted(r["episode_id"] for r in ran)
    for episode in episodes:
        assert (episode["outcome"], episode["reward"]) == ("success", 1.0)
        kinds = [s["kind"] for s in episode["steps"]]
        assert kinds == [
            "llm_call", "thought", "action", "action_result", "llm_call", "thought", "output",
        ]  # fmt: skip
        first, _, action, result, second, *_ = episode["steps"]
        assert first["call"]["response"]["content"] == scripted.ACT
        assert first["call"]["request"]["messages"][-1] == {
            "role": "assistant",
            "content": "<response>",
        }
        assert second["call"]["response"]["content"].startswith(
            "<reasoning>" + scripted.FINAL_REASONING
        )
        assert (action["name"], action["arguments"]) == ("open_door", scripted.ARGUMENTS)
        assert (result["id"], result["content"]) == (action["id"], scripted.RESULT)
        meta = episode["metadata"]
        assert (meta["args.room.name"], meta["args.room.exits"]) == ("dark room", ["north"])
        assert (meta["context"], meta["domain"]) == ("dark-room", "text-adventure")
    # Each call is its own token segment (Daydreams re-renders its prompt every
    # call); the scripted upstream's ids are the prompt's and the answer's bytes.
    assert len(tokens) == 6
    answers = []
    for row in tokens:
        ids, length = row["input_ids"], row["prompt_len"]
        assert bytes(ids[:length]).decode().startswith("user: ")
        assert row["loss_mask"] == [0] * length + [1] * (len(ids) - length)
        answers.append(bytes(ids[length:]).decode())
    assert sorted(answers) == sorted([scripted.FINISH, scripted.ACT] * 3)


def release_without_run_models(script: Path, tmp: Path) -> Path:
    """The dark-room script beside a copy of @daydreamsai/core made into a release
    0.3.23 whose runs ignore their own model (the other packages linked)."""
    modules = tmp / "agent" / "node_modules"
    (modules / "@daydreamsai").mkdir(parents=True)
    for entry in (PACKAGE / "node_modules").iterdir():
        if entry.name != "@daydreamsai":
            (modules / entry.name).symlink_to(entry)
    core = modules / "@daydreamsai" / "core"
    shutil.copytree(PACKAGE / "node_modules" / "@daydreamsai" / "core", core)
    dist = core / "dist" / "index.js"
    code = dist.read_text()
    assert code.count("params.model ?? ") == 1
    dist.write_text(code.replace("params.model ?? ", ""))
    manifest = json.loads((core / "package.json").read_text())
    (core / "package.json").write_text(json.dumps({**manifest, "version": "0.3.23"}))
    shutil.copytree(PACKAGE / "build-test", tmp / "agent" / "build-test")
    return tmp / "agent" / "build-test" / script.relative_to(PACKAGE / "build-test")


def test_bad_input_ends_episodes_at_once_and_never_costs_an_answer(
    settings_for: Callable[..., Settings], tmp_path: Path, dark_room: Path
) -> None:
    with pipeline(settings_for, tmp_path, "format.format=episode") as run:
        (threw,) = rollouts(dark_room, run.settings, "--throw", "run", "--group", "threw")
        assert "the agent failed after its run" in threw["error"], threw
        run.upstream.fail_next("die_mid_stream")
        (died,) = rollouts(dark_room, run.settings, "--group", "died")
        assert died["outcome"] == "failure", died
        run.upstream.fail_next("null_logprobs")
        (null,) = rollouts(dark_room, run.settings, "--group", "null")
        assert null["outcome"] == "success", null
        assert (
            run.metric('stream_export_gateway_token_capture_lost_total{reason="null_logprobs"}')
            == 1
        )
        status, body, _ = post(base(run.settings) + "/v1/responses", {"model": "m", "input": "hi"})
        assert status == 404 and body["error"]["code"] == "unsupported_route", body
        assert ".chat(model)" in body["error"]["message"]
        assert "/v1/chat/completions" in body["error"]["message"]
        assert (
            run.metric('stream_export_gateway_refused_requests_total{reason="unsupported_route"}')
            == 1
        )
        changed_core = release_without_run_models(dark_room, tmp_path)
        (changed,) = rollouts(
            changed_core, run.settings, "--base-url", run.upstream.url, "--group", "changed"
        )
        assert (
            "@daydreamsai/core 0.3.23 changed the hooks stream-export relies on" in changed["error"]
            and "no longer calls the run's own model" in changed["error"]
        ), changed
        episodes = {e["group_id"]: e for e in written(run.settings, 4)}
        with serving(strict=True) as hosted:
            settings = msgspec.structs.replace(
                run.settings,
                gateway=msgspec.structs.replace(
                    run.settings.gateway,
                    upstreams=[hosted.url],
                    port=free_port(),
                    state_dir=str(tmp_path / "hosted"),
                ),
            )
            with running(settings, tmp_path / "hosted.log"):
                (strict,) = rollouts(dark_room, settings, "--group", "hosted")
                lost = 'stream_export_gateway_token_capture_lost_total{reason="fields_refused"}'
                refused = get(base(settings) + "/metrics")[1].decode()
            assert strict["outcome"] == "success", strict
            assert [e.status for e in hosted.exchanges] == [400, 200, 200]  # remembered
            assert f"{lost} 2.0" in refused
        episodes |= {e["group_id"]: e for e in written(run.settings, 5)}
    for name in ("threw", "died", "changed"):  # failures at once, never the idle timeout
        episode = episodes[name]
        assert episode["outcome"] == "failure" and episode["duration"] < 30, episode
        assert episode["metadata"]["error"], episode["metadata"]
    assert [s["kind"] for s in episodes["threw"]["steps"]][-1] == "output"  # every step kept
    (broken,) = episodes["died"]["steps"]  # what streamed before the upstream died
    assert (broken["kind"], broken["call"]["finish_reason"]) == ("llm_call", "aborted")
    for name in ("null", "hosted"):  # answered and recorded, text only
        episode = episodes[name]
        assert episode["outcome"] == "success"
        assert [s["kind"] for s in episode["steps"]][:2] == ["llm_call", "thought"]


def test_a_steps_batch_is_recorded_once_across_a_kill_9(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    with serving() as upstream:
        settings = settings_for(
            f"gateway.upstreams={upstream.url}",
            f"gateway.port={free_port()}",
            f"gateway.state_dir={tmp_path / 'gateway'}",
        )
        with running(settings, tmp_path / "first.log") as gateway:
            key = start_episode(settings, metadata={"args": {"room": {"name": "cellar"}}})[
                "episode_id"
            ]
            steps = f"{base(settings)}/v1/episodes/{key}/steps"
            batch = {"batch": 0, "steps": [{"kind": "thought", "content": "Dark."}]}
            first = post(steps, batch)
            assert first[:2] == (200, {"episode_id": key, "batch": 0, "first_seq": 0, "steps": 1})
            assert post(steps, batch)[:2] == first[:2]  # a repeat: answered as the first
            other = {"batch": 0, "steps": [{"kind": "thought", "content": "Light."}]}
            assert post(steps, other)[1]["error"]["code"] == "batch_conflict"
            skipped = {"batch": 2, "steps": [{"kind": "thought"}]}
            assert post(steps, skipped)[1]["error"]["code"] == "batch_out_of_order"
            gateway.kill9()
        with running(settings, tmp_path / "second.log"):
            assert post(steps, batch)[:2] == first[:2]  # the log kept the last answer
            action = {"kind": "action", "name": "open_door", "arguments": {"direction": "north"}}
            second = post(steps, {"batch": 1, "steps": [action]})
            assert second[1] == {"episode_id": key, "batch": 1, "first_seq": 1, "steps": 2}
            status, ended, _ = post(f"{base(settings)}/v1/episodes/{key}/end", {"outcome": "other"})
            assert (status, ended["steps"]) == (200, 2)
    found = events_of(settings, key)
    start = found[0]
    assert isinstance(start, EpisodeStart) and start.metadata == {"args.room.name": "cellar"}
    seqs = {(e.seq, e.kind, e.content) for e in found if isinstance(e, Step)}
    assert seqs == {(0, "thought", "Dark."), (1, "action", "")}  # once each (copies equal)
    assert isinstance(found[-1], EpisodeEnd) and found[-1].steps == 2


def test_a_run_against_the_tiny_vllm_gives_token_rows(
    settings_for: Callable[..., Settings],
    tmp_path: Path,
    dark_room: Path,
    vllm_server: VllmServer,
) -> None:
    settings = settings_for(
        f"gateway.upstreams={vllm_server.url}/v1",
        f"gateway.port={free_port()}",
        f"gateway.state_dir={tmp_path / 'gateway'}",
        "format.format=tokens",
        "sink.flush_interval_ms=20",
    )
    with Worker(settings, tmp_path / "worker.log"), running(settings, tmp_path / "gw.log"):
        model = ("--model", vllm_server.model, "--compact-prompt", "--max-tokens", "16")
        (ran,) = rollouts(dark_room, settings, *model)
        assert "episode_id" in ran, ran  # a random model fails the task, not the recording
        rows = written(settings, 1)
    assert {row["episode_id"] for row in rows} == {ran["episode_id"]}
    for row in rows:  # each call its own segment, its ids and logprobs vLLM's
        length, ids = row["prompt_len"], row["input_ids"]
        assert 0 < length < len(ids) <= length + 16
        assert row["loss_mask"] == [0] * length + [1] * (len(ids) - length)
        assert len(row["logprobs"]) == len(ids) and all(x <= 0 for x in row["logprobs"][length:])


def test_the_page_shows_a_rollout_s_record_the_seed_s_and_a_steps_request() -> None:
    """docs/daydreams.md's examples: the record every rollout above gives, the seed's
    record, and a steps request the gateway accepts."""
    page = (ROOT / "docs" / "daydreams.md").read_text()
    found = re.findall(r"<!-- example: held by [^>]+ -->\n+```json\n(.*?)```", page, re.S)
    record, seed, request = (json.loads(block) for block in found)
    assert (record, seed) == (RECORD, SEED[0])
    batch = steps.parse(request)
    assert [step.kind for step in batch.steps] == ["thought", "action"]
