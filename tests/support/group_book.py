"""The group book for its tests: a book, members, and streams crashed and replayed."""

from __future__ import annotations

from hypothesis import strategies as st

from stream_export.groups.state import Dropped, Emitted, GroupBook, Late, Member, Result


def book(**overrides: object) -> GroupBook:
    args: dict[str, object] = {
        "timeout_s": 100.0,
        "min_members": 2,
        "default_size": None,
        "closed_retention_s": 1000.0,
    }
    args.update(overrides)
    return GroupBook(**args)  # type: ignore[arg-type]


def m(eid: str, time: float, reward: float = 0.0, truncated: bool = False) -> Member:
    return Member(eid, time, reward, truncated)


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[tuple[str, Member, int | None]], dict[str, int]]:
    """Rollouts of several groups, shuffled, with duplicates: (group, member, size)."""
    n_groups = draw(st.integers(1, 8))
    events: list[tuple[str, Member, int | None]] = []
    sizes: dict[str, int] = {}
    for g in range(n_groups):
        size = draw(st.integers(1, 6))
        arrive = draw(st.integers(0, size))  # some groups never fill
        start = draw(st.floats(0, 300))
        sizes[f"g{g}"] = size
        for i in range(arrive):
            member = Member(
                f"g{g}-{i}",
                start + draw(st.floats(0, 150)),
                draw(st.sampled_from([0.0, 0.5, 1.0])),
                draw(st.booleans()),
            )
            events.append((f"g{g}", member, size))
    events = draw(st.permutations(events))
    # duplicates: repeat some events later in the stream
    for index in draw(st.lists(st.integers(0, max(0, len(events) - 1)), max_size=5)):
        if events:
            events.insert(draw(st.integers(index, len(events))), events[index])
    return events, sizes


Tick = tuple[int, float]  # a watermark: (source partition, wall time)
Verdict = tuple[str]  # a judge's verdict for a group
Message = tuple[str, Member, int | None] | Tick | Verdict
#: A crash case: the messages, cut, crash and replay offsets, and whether groups are judged.
Crash = tuple[list[Message], int, int, int, bool]


@st.composite
def crashes(draw: st.DrawFn) -> Crash:
    """A stream with watermark ticks of two sources, and a crash: state stored after
    ``cut`` messages, the worker going on to ``crash``, its successor replaying
    from ``replay`` (at or before ``cut``: offsets committed lag the state). With a
    judge, verdicts come at random (some before their group is judged, some twice),
    and after a watermark that times every group out, one for each group."""
    events, sizes = draw(streams())
    messages: list[Message] = list(events)
    for _ in range(draw(st.integers(0, 6))):
        tick = (draw(st.integers(0, 1)), draw(st.floats(0, 600)))
        messages.insert(draw(st.integers(0, len(messages))), tick)
    judged = draw(st.booleans())
    if judged:
        for _ in range(draw(st.integers(0, 8))):
            verdict = (draw(st.sampled_from(sorted(sizes))),)
            messages.insert(draw(st.integers(0, len(messages))), verdict)
        messages += [(0, 700.0), (1, 700.0), *((g,) for g in sorted(sizes))]  # within retention
    cut = draw(st.integers(0, len(messages)))
    crash = draw(st.integers(cut, len(messages)))
    return messages, cut, crash, draw(st.just(cut) | st.integers(0, cut)), judged


def apply(b: GroupBook, messages: list[Message], start: int, stop: int) -> list[Result]:
    """Messages ``start`` to ``stop`` (their offsets), as the groups stage applies them."""
    results: list[Result] = []
    for offset in range(start, stop):
        message = messages[offset]
        if len(message) == 1:
            results += b.judged(message[0], offset)
        elif len(message) == 2:
            source, wall = message
            results += b.watermark(source, wall, sources=2, slack=5.0, offset=offset)
        else:
            group_id, member, size = message
            results += b.add(group_id, member, size, offset)
    return results


def published(results: list[Result]) -> dict[str, tuple[object, ...]]:
    """What the stage would publish of each closed group and late rollout, by record id."""
    out: dict[str, tuple[object, ...]] = {}
    for r in results:
        if isinstance(r, Emitted):
            ids = tuple(x.episode_id for x in r.group.members)
            record = (r.reason, r.complete, r.missing, r.closed_at, ids, r.group.duplicates)
            assert out.setdefault(r.group.group_id, record) == record
        elif isinstance(r, Dropped):
            out[r.group.group_id] = ("dropped", tuple(x.episode_id for x in r.group.members))
        elif isinstance(r, Late):
            out[f"{r.group_id}/late/{r.member.episode_id}"] = (r.member.time,)
    return out
