"""Every training record shown in the docs is what the worker writes for its events.

Each ```json block of a docs page is a record example and follows a marker

    <!-- records: SOURCE [setting=value ...] -->

SOURCE is ``contract`` (the contract page's dark-room step events, assembled by the
assembler's own rules, tests/support/assemble_sim.py), ``calls`` (the tool-calling
episode of model calls of tests/support/call_episodes.py), ``scored`` (the same
with the scores of tests/support/typed_rows.py) or ``golden:ID,ID``
(episodes of tests/golden/episodes.jsonl); the settings are ``format.*`` settings. The test
sends the episodes through the Kafka encoding and the worker's formatter and
compares the bytes, so the docs cannot drift from the code.
``UPDATE_DOCS=1 pytest tests/unit/docs/test_records.py`` rewrites the blocks.

A block that shows what another test produces (a real agent's record, a request
body) follows ``<!-- example: held by PATH -->`` instead: PATH is that test, and
it must read the page.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from stream_export.contract.decoding import decode_episode, decode_event, encode
from stream_export.contract.episode import Episode
from stream_export.output.formatter import build
from stream_export.runtime.metrics import Metrics
from stream_export.settings.assemble import AssembleSettings
from stream_export.settings.format import FormatSettings
from tests.support.assemble_sim import Pipeline
from tests.support.call_episodes import tool_episode
from tests.support.typed_rows import scored

ROOT = Path(__file__).resolve().parents[3]
PAGES = sorted((ROOT / "docs").rglob("*.md"))
CONTRACT = ROOT / "docs" / "contract" / "events.md"
GOLDEN = ROOT / "tests" / "golden" / "episodes.jsonl"
MARKED = re.compile(r"<!-- records: (?P<spec>[^>]*?) -->\n+```json\n(?P<body>.*?)```", re.S)
HELD = re.compile(r"<!-- example: held by (?P<path>\S+) -->\n+```json\n")


def contract_episode() -> Episode:
    """The contract page's dark-room events, assembled as the worker assembles them."""
    text = CONTRACT.read_text()
    block = re.findall(r"```jsonl\n(.*?)```", text, flags=re.S)[0]  # the llm_call one is next
    events = [decode_event(line.encode()) for line in block.strip().splitlines()]
    pipeline = Pipeline(AssembleSettings())
    pipeline.batch(list(enumerate(events)), wall=time.time())
    assert not pipeline.dead, pipeline.dead
    (episode,) = pipeline.emitted
    return episode


def episodes(source: str) -> list[Episode]:
    if source == "contract":
        return [contract_episode()]
    if source == "calls":
        return [tool_episode()]
    if source == "scored":
        return [scored(tool_episode())]
    kind, _, ids = source.partition(":")
    assert kind == "golden", f"unknown records source {source!r}"
    golden = {e.episode_id: e for e in map(decode_episode, GOLDEN.read_bytes().splitlines())}
    return [golden[i] for i in ids.split(",")]


def records(spec: str) -> str:
    """The lines the worker writes for a marker's source and settings."""
    source, *options = spec.split()
    settings = dict(option.split("=", 1) for option in options)
    fields = settings.pop("metadata_fields", "")
    formatter = build(
        FormatSettings(**settings, metadata_fields=fields.split(",") if fields else []),  # type: ignore[arg-type]
        Metrics(),
    )
    # through the episodes topic's bytes, as the sink receives them
    lines = [line for e in episodes(source) for line in formatter(decode_episode(encode(e)))]
    return "".join(line.decode() + "\n" for line in lines)


def test_every_record_example_is_what_the_worker_writes() -> None:
    shown = 0
    for page in PAGES:
        text = page.read_text()
        marked = list(MARKED.finditer(text))
        name = page.relative_to(ROOT)
        held = list(HELD.finditer(text))
        for match in held:
            holder = ROOT / match["path"]
            assert holder.is_file() and name.as_posix() in holder.read_text(), (
                f"{name}: {match['path']} does not read the page"
            )
        blocks = text.count("```json\n")
        assert len(marked) + len(held) == blocks, f"{name}: a ```json block without a marker"
        if marked and os.environ.get("UPDATE_DOCS"):
            for match in reversed(marked):
                start, end = match.span("body")
                text = text[:start] + records(match["spec"]) + text[end:]
            page.write_text(text)
            marked = list(MARKED.finditer(text))
        for match in marked:
            expected = records(match["spec"])
            assert match["body"] == expected, (
                f"{name}: block after <!-- records: {match['spec']} -->"
            )
        shown += len(marked)
    assert shown >= 4


def test_the_dark_room_completion_carries_the_action_result() -> None:
    """The seed's rule (completion = reasoning plus action results), on the contract
    page's own example: the record does not stop at the action."""
    text = CONTRACT.read_text()
    (contract,) = [m for m in MARKED.finditer(text) if m["spec"] == "contract"]
    ending = (
        r"Action: try opening the door\n\nThe door was unlocked and you were able to exit the room."
    )
    assert contract["body"].rstrip().endswith(ending + '"}')
