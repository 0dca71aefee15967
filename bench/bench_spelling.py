"""What spelling floats as ``json.dumps`` does would cost the sink (issue 36, item 6).

    python -m bench.bench_spelling [--episodes 300] [--rounds 3] [--seconds 1.0]

msgspec writes keys, strings, integers and separators (``", "`` and ``": "`` after
``msgspec.json.format``) as ``json.dumps(record, ensure_ascii=False)`` does, and
every float with the same shortest round-trip digits; only the notation of
floats below 1e-4 or from 1e16 on differs (``0.00001``, ``1.5e-6``, ``1e16``
where Python writes ``1e-05``, ``1.5e-06``, ``1e+16``): most logprobs of
confident tokens. :func:`python_spelling` respells those, outside strings only
(bench/test_bench_spelling.py checks it against ``json.dumps`` over the whole
float range), as cheaply as we found: a cheap look for a candidate, then C-level
regex passes with literal replacements over the parts between strings.

The benchmark measures the sink's per-episode work, decode an episodes-topic
record and format it, with and without that respelling, in alternating rounds,
on two loads: the demo's text episodes (format ``text`` with metadata columns,
and ``episode``) and bench.token_load's model-call episodes (format ``tokens``:
float32 logprobs, ~6 % of them below 1e-4). Reports episodes/s each way and
their ratio, min/median/max over the rounds. The README's "Bytes" paragraph
gives the figures behind keeping msgspec's notation.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Callable
from typing import Final

from bench.bench_formats import episode_bytes
from bench.raw_pipeline import DictStore
from bench.token_load import generate
from stream_export.assemble.episode import build_episode
from stream_export.assemble.state import PartitionState, receive
from stream_export.contract.decoding import decode_episode, encode
from stream_export.output.formatter import build
from stream_export.runtime.metrics import Metrics
from stream_export.settings.assemble import AssembleSettings
from stream_export.settings.format import FormatSettings

CASES: Final = {
    "text, metadata columns": ("text", FormatSettings(metadata_mode="columns")),
    "episode": ("text", FormatSettings(format="episode")),
    "tokens": ("tokens", FormatSettings(format="tokens")),
}
#: A JSON string as msgspec writes it (a quote inside is escaped), captured so that
#: ``split`` keeps it: the parts between are numbers, literals and punctuation.
_STRING: Final = re.compile(rb'("[^"\\]*(?:\\.[^"\\]*)*")')
#: Exponents Python spells otherwise: one negative digit (``e-6``: ``e-06``; ``e-10``
#: and below are the same in both) and any positive one (``e16``: ``e+16``).
#: Literal replacements, so that ``sub`` stays in C however many floats match.
_SHORT_NEGATIVE: Final = re.compile(rb"e-(?=[1-9](?![0-9]))")
_POSITIVE: Final = re.compile(rb"e(?=[0-9])")
#: A float in [1e-5, 1e-4), which msgspec writes without an exponent.
_TINY: Final = re.compile(rb"0\.0000([1-9])([0-9]*)")
_DIGIT_OR_POINT: Final = frozenset(b"0123456789.")
#: Where a float to respell may be: an exponent, or a tiny fixed float.
_EXPONENT: Final = re.compile(rb"e-?[0-9]")
_TINY_MARK: Final = b"0.0000"
#: What comes before a number in msgspec's line: ``[`` or the space of ``", "`` or
#: ``": "`` (never a quote or a letter, as in the hex of a uuid string).
_BEFORE_NUMBER: Final = frozenset(b"[ ")
_MINUS: Final = ord("-")


def _tiny(match: re.Match[bytes]) -> bytes:
    at = match.start()
    if at and match.string[at - 1] in _DIGIT_OR_POINT:  # inside 10.00001: not tiny
        return match[0]
    rest = match[2]
    return match[1] + (b"." + rest if rest else b"") + b"e-05"


def _number_at(line: bytes, at: int) -> bool:
    """Whether the mark at ``at`` may be part of a number (else it is inside a
    string: ``78e51061-...``); a string that reads like a number is told apart
    later, when the line is split."""
    j = at - 1
    if line[at] == ord("e"):  # an exponent: digits (and a point) before it
        while j >= 0 and line[j] in _DIGIT_OR_POINT:
            j -= 1
        if j == at - 1:
            return False
    elif j >= 0 and line[j] in _DIGIT_OR_POINT:  # 0.0000 inside 10.00001
        return False
    if j >= 0 and line[j] == _MINUS:
        j -= 1
    return j >= 0 and line[j] in _BEFORE_NUMBER


def _may_respell(line: bytes) -> bool:
    """Whether ``line`` may hold a float to respell (mostly it does not)."""
    if any(_number_at(line, m.start()) for m in _EXPONENT.finditer(line)):
        return True
    at = line.find(_TINY_MARK)
    while at != -1:
        if _number_at(line, at):
            return True
        at = line.find(_TINY_MARK, at + 1)
    return False


def _respell(part: bytes) -> bytes:
    if b"e" in part:
        part = _POSITIVE.sub(b"e+", _SHORT_NEGATIVE.sub(b"e-0", part))
    if b"0.0000" in part:
        part = _TINY.sub(_tiny, part)
    return part


def python_spelling(line: bytes) -> bytes:
    """A line msgspec wrote, byte for byte as ``json.dumps(record,
    ensure_ascii=False)`` writes the same record."""
    if not _may_respell(line):
        return line
    parts = _STRING.split(line)
    for i in range(0, len(parts), 2):
        parts[i] = _respell(parts[i])
    return b"".join(parts)


def token_episodes(count: int) -> list[bytes]:
    """bench.token_load's episodes as the assembler publishes them."""
    load = generate(count, seed=36, now=time.time())
    store = DictStore()
    state = PartitionState(0, AssembleSettings(), store)
    out: list[bytes] = []
    for offset, (key, value) in enumerate(load.messages):
        receive(state, key, value, offset, time.time())
        finished = state.take_finished()
        for item in finished:
            episode = build_episode(0, item)
            if episode is not None:
                out.append(encode(episode))
        store.persist(state, finished, 3600.0)
    return out


def rate(
    settings: FormatSettings, data: list[bytes], spell: Callable[[bytes], bytes], s: float
) -> float:
    """Episodes per second: decode and format every record of ``data``, each line
    through ``spell``, repeatedly for ``s`` seconds."""
    formatter = build(settings, Metrics())
    done, began = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - began) < s or done < 3 * len(data):
        for raw in data:
            for line in formatter(decode_episode(raw)):
                spell(line)
        done += len(data)
    return done / elapsed


def _as_is(line: bytes) -> bytes:
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    loads = {"text": episode_bytes(args.episodes, 1)[0], "tokens": token_episodes(args.episodes)}
    print(f"{'case':24} {'msgspec ep/s':>13} {'json.dumps ep/s':>16} {'ratio min/med/max':>19}")
    for name, (load, settings) in CASES.items():
        plain, spelled = [], []
        for _ in range(args.rounds):  # alternating, so load on the machine hits both
            plain.append(rate(settings, loads[load], _as_is, args.seconds))
            spelled.append(rate(settings, loads[load], python_spelling, args.seconds))
        ratios = sorted(b / a for a, b in zip(plain, spelled, strict=True))
        print(
            f"{name:24} {statistics.median(plain):13,.0f} {statistics.median(spelled):16,.0f} "
            f"{ratios[0]:6.2f} {statistics.median(ratios):5.2f} {ratios[-1]:5.2f}"
        )


if __name__ == "__main__":
    main()
