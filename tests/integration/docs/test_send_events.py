"""docs/guides/send-events.md's examples run as the page shows them: the Python, the
TypeScript (kafkajs) and the Go (franz-go) program each send one episode to a real
broker, and a real worker writes each episode's record, byte for byte.

The page shows each file whole after ``<!-- example: file PATH -->``; the first test
holds the page to the files (``UPDATE_DOCS=1`` rewrites the blocks). dev/setup --dev
installs the TypeScript example's locked packages and builds the Go one
(tests/support/go_programs.py finds it)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from stream_export.kafka import topics
from stream_export.settings import Settings
from tests.support import go_programs
from tests.support.doc_blocks import ROOT
from tests.support.processes import Worker
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

PAGE = ROOT / "docs" / "guides" / "send-events.md"
EXAMPLES = ROOT / "examples" / "send-events"
TYPESCRIPT = EXAMPLES / "typescript"
SHOWN = re.compile(
    r"<!-- example: file (?P<path>\S+) -->\n+```\w+\n(?P<code>.*?)^```$", re.S | re.M
)
#: The record of each example's episode, with its id (format.metadata_fields=episode_id).
RECORD = (
    b'{"prompt": "You are in a dark room with a door to the north.", "completion": '
    b'"\\n\\nI need to find a way out. I should check if the door is locked.\\n\\n'
    b"Action: try opening the door\\n\\n"
    b'The door was unlocked and you were able to exit the room.", "episode_id": "%s"}'
)


def test_the_page_shows_each_example_file_whole() -> None:
    """``UPDATE_DOCS=1`` rewrites the blocks from the files."""
    text = PAGE.read_text()
    if os.environ.get("UPDATE_DOCS"):
        for match in reversed(list(SHOWN.finditer(text))):
            start, end = match.span("code")
            text = text[:start] + (ROOT / match["path"]).read_text() + text[end:]
        PAGE.write_text(text)
    blocks = {m["path"]: m["code"] for m in SHOWN.finditer(text)}
    assert set(blocks) == {
        "examples/send-events/python/send_events.py",
        "examples/send-events/typescript/send-events.ts",
        "examples/send-events/go/main.go",
    }
    for path, code in blocks.items():
        assert code == (ROOT / path).read_text(), f"{PAGE.name}: the block of {path} differs"


def typescript() -> list[str]:
    """The TypeScript example, type-checked and compiled by tsc as pinned in its lock."""
    tsc = TYPESCRIPT / "node_modules" / ".bin" / "tsc"
    assert tsc.exists(), "the TypeScript example's packages are missing: run dev/setup --dev"
    done = subprocess.run(
        [str(tsc), "-p", "tsconfig.json"],
        cwd=TYPESCRIPT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return ["node", str(TYPESCRIPT / "dist" / "send-events.js")]


def test_each_example_episode_becomes_its_record(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = settings_for("format.metadata_mode=columns", "format.metadata_fields=episode_id")
    # What a reader sets for the worker, read by the examples too (steps topic: fresh).
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("STREAM_EXPORT_")},
        "STREAM_EXPORT_KAFKA_BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
        "STREAM_EXPORT_TOPICS_STEPS": settings.topics.steps,
    }
    out = Path(settings.sink.output_dir) / "training-data.jsonl"

    def lines() -> list[bytes]:
        data = out.read_bytes() if out.exists() else b""
        return data.split(b"\n")[:-1]

    asyncio.run(topics.apply(settings))  # as `stream-export topics apply` does
    with Worker(settings, tmp_path / "worker.log") as worker:
        examples = {  # tsc runs while the worker starts
            "python": [sys.executable, str(EXAMPLES / "python" / "send_events.py")],
            "typescript": typescript(),
            "go": [str(go_programs.built(EXAMPLES / "go", "send-events"))],
        }
        running = {
            name: subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for name, command in examples.items()
        }
        ids = {}
        try:
            for name, proc in running.items():
                stdout, stderr = proc.communicate(timeout=60)
                assert proc.returncode == 0, f"the {name} example failed:\n{stdout}{stderr}"
                ids[name] = stdout.strip()
        finally:
            for proc in running.values():
                proc.kill()
                proc.wait()

        def written() -> bool:
            assert worker.alive(), worker.log()[-3000:]
            return len(lines()) >= len(ids)

        wait_for(
            written,
            timeout=60,
            what=lambda: f"{len(ids)} records in {out}\n{worker.log()[-3000:]}",
        )
    assert sorted(lines()) == sorted(RECORD % i.encode() for i in ids.values()), ids
