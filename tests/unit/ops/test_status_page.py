"""The status page's parts: recent error rates, sealed files, disk space (pure), and
the page itself in headless Chromium on a known status document: humanised
durations and sizes, both lags, recent errors, sealed files, disk, links."""

from __future__ import annotations

import asyncio
import re
import sys
import time
import urllib.error
import urllib.request
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from stream_export.groups import records
from stream_export.ops import http, status
from stream_export.output.layout import ManifestEntry, manifest_path
from stream_export.runtime.metrics import CURVE_VERSIONS, SPREAD_CAP, Metrics
from tests.support.call_episodes import tool_episode
from tests.support.monitoring import chromium, dom_text, free_port

GIB = 1 << 30


def test_recent_errors_are_the_increase_over_the_window() -> None:
    m = Metrics()
    window = status.Window(window_s=300)

    def sample() -> dict[str, float]:
        return status.error_counts(status.collect(m.registry))

    m.dead_letters.labels("not_json").inc(4)
    window.add(0.0, sample())
    m.dead_letters.labels("not_json").inc(2)
    m.sink_errors.labels("no_space").inc()
    m.format_errors.inc()
    window.add(60.0, sample())
    rows = status.error_rows(sample(), window.increase(), window.span())
    assert rows == [
        {"kind": "dead_letters", "reason": "not_json", "total": 6, "recent": 2, "per_min": 2.0},
        {"kind": "format", "reason": "", "total": 1, "recent": 1, "per_min": 1.0},
        {"kind": "sink", "reason": "no_space", "total": 1, "recent": 1, "per_min": 1.0},
    ]  # counters that stayed at 0 are left out
    for second in range(61, 400):
        window.add(float(second), sample())
    rows = status.error_rows(sample(), window.increase(), window.span())
    assert {r["recent"] for r in rows} == {0} and rows[0]["total"] == 6


def entry(seq: int, size: int) -> bytes:
    e = ManifestEntry(
        name=f"training-data-{seq:06d}.jsonl",
        seq=seq,
        worker_id="w1",
        topic="t",
        records=1,
        bytes=size,
        sha256="0" * 64,
        compression="none",
        first_event_time=None,
        last_event_time=None,
        offsets={},
        sealed_at=1_767_225_600.0 + seq,
        reason="size",
    )
    return msgspec.json.encode(e) + b"\n"


def test_sealed_files_are_read_from_the_manifest_incrementally(tmp_path: Path) -> None:
    sealed = status.SealedFiles(str(tmp_path), "training-data")
    assert sealed.update() == {"files": 0, "bytes": 0, "newest": None, "newest_sealed_at": None}
    path = manifest_path(tmp_path, "training-data")
    path.write_bytes(entry(0, 100) + entry(1, 50) + entry(2, 7)[:20])  # a torn last line
    assert sealed.update()["files"] == 2
    with path.open("ab") as fh:
        fh.write(entry(2, 7)[20:])
    got = sealed.update()
    assert got == {
        "files": 3,
        "bytes": 157,
        "newest": "training-data-000002.jsonl",
        "newest_sealed_at": 1_767_225_602.0,
    }
    path.write_bytes(entry(5, 1))  # replaced by a shorter one: counted again
    assert sealed.update()["files"] == 1


def test_disk_space_of_the_output_folder_or_its_nearest_ancestor(tmp_path: Path) -> None:
    space = status.disk_space(str(tmp_path / "not" / "yet"))
    assert space is not None and 0 <= space["free_bytes"] <= space["total_bytes"]


STATUS: dict[str, Any] = {
    "worker_id": "stream-export-0",
    "version": "9.9.9",
    "uptime_s": 3725.0,
    "ready": False,
    "checks": {"partitions_assigned": True, "output_writable": False},
    "partitions": ["agent-steps/0"],
    "throughput": {"events_per_s": 1234.5, "records_per_s": 12.0, "bytes_per_s": 1536.0},
    "totals": {
        "events_consumed": 9,
        "episodes_emitted": 2,
        "records_written": 4321,
        "bytes_written": 5 * GIB // 2,
    },
    "open_episodes": 3,
    "lag": [
        {"topic": "agent-episodes", "partition": 0, "messages": 40},
        {"topic": "agent-steps", "partition": 0, "messages": 7},
    ],
    "lag_total": 47,
    "lag_by_stage": {"assemble": 7, "sink": 40},
    "lag_topics": {"assemble": "agent-steps", "sink": "agent-episodes"},
    "errors": [
        {"kind": "sink", "reason": "no_space", "total": 9, "recent": 3, "per_min": 0.6},
        {"kind": "dead_letters", "reason": "not_json", "total": 5, "recent": 0, "per_min": 0.0},
    ],
    "error_window_s": 300.0,
    "sink_paused": True,
    "last_write_age_s": 125.0,
    "sealed": {"files": 12, "bytes": 3 << 20, "newest": "training-data-000011.jsonl.gz"},
    "disk": {"free_bytes": 10 * GIB, "total_bytes": 40 * GIB},
    "output_error": None,
    "recent_records": [{"file": "training-data.jsonl", "bytes": 2048, "preview": '{"prompt"'}],
}


def table(dom: str, element_id: str) -> list[list[str]]:
    match = re.search(rf'<table id="{element_id}">(.*?)</table>', dom, flags=re.S)
    assert match, f"#{element_id} missing"
    rows = re.findall(r"<tr>(.*?)</tr>", match.group(1), flags=re.S)
    return [
        [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", r)]
        for r in rows
    ]


def rendered(document: dict[str, Any], tmp_path: Path) -> str:
    """The page's DOM in headless Chromium once it has rendered ``document``."""
    snap = http.Snapshot(
        taken=time.monotonic() + 3600,  # fresh for the whole test
        ready=False,
        checks={},
        readyz=b"{}",
        status=msgspec.json.encode(document),
    )
    page = resources.files("stream_export.ops").joinpath("status.html").read_text()
    port = free_port()
    server = http.Server("127.0.0.1", port, Metrics().registry, lambda: snap, page)
    asyncio.run(server.start())
    try:
        done = chromium("--dump-dom", f"http://127.0.0.1:{port}/", profile=tmp_path / "p")
    finally:
        asyncio.run(server.stop())
    assert done.returncode == 0 and '<body data-updates="' in done.stdout, done.stderr[-2000:]
    return done.stdout


def test_the_page_humanises_and_shows_lags_errors_files_disk_and_links(tmp_path: Path) -> None:
    sealed = STATUS["sealed"] | {"newest_sealed_at": time.time() - 90}
    dom = rendered(STATUS | {"sealed": sealed, "groups": None}, tmp_path)
    assert '<section id="groups" hidden="">' in dom
    assert dom_text(dom, "ready") == "not ready"
    assert re.search(r'<span id="paused" class="badge bad">sink paused</span>', dom)
    assert dom_text(dom, "uptime") == "1 h 2 min"
    assert dom_text(dom, "events_per_s") == "1,234.5"
    assert dom_text(dom, "bytes_per_s") == "1.5 KiB/s"
    assert dom_text(dom, "bytes_written") == "2.5 GiB since start"
    assert dom_text(dom, "records_written") == "4,321"
    assert dom_text(dom, "last_write") == "2 min 5 s ago"
    assert (dom_text(dom, "lag_assemble"), dom_text(dom, "lag_sink")) == ("7", "40")
    assert dom_text(dom, "sealed_files") == "12"
    assert re.fullmatch(
        r"3\.0 MiB, newest training-data-000011\.jsonl\.gz \(1 min \d+ s ago\)",
        dom_text(dom, "sealed_detail"),
    )
    assert dom_text(dom, "disk_free") == "10 GiB"
    assert dom_text(dom, "disk_detail") == "of 40 GiB (75% used)"
    assert '<span id="output_error" class="badge bad" hidden=""></span>' in dom
    assert table(dom, "lag")[1:] == [
        ["sink", "agent-episodes", "0", "40"],
        ["assembler", "agent-steps", "0", "7"],
    ]
    assert dom_text(dom, "error_window") == "(last 5 min / since start)"
    assert table(dom, "errors") == [
        ["kind", "reason", "recent", "per min", "total"],
        ["sink", "no_space", "3", "0.6", "9"],
        ["dead_letters", "not_json", "0", "0", "5"],
    ]
    assert table(dom, "recent")[1] == ["training-data.jsonl", "2.0 KiB", '{"prompt"']
    links = dict(re.findall(r'<a id="link-(\w+)" href="([^"]+)">', dom))
    assert links == {
        "metrics": "metrics",
        "readyz": "readyz",
        "healthz": "healthz",
        "status": "status.json",
    }


def groups_stage_numbers() -> dict[str, Any]:
    """The groups summary of a registry that saw a few of everything."""
    m = Metrics()
    m.groups_open.labels("0").set(12)
    m.groups_open.labels("1").set(5)
    m.groups_closed.labels("size").inc(1200)
    m.groups_closed.labels("timeout").inc(34)
    m.groups_incomplete.inc(30)
    m.groups_dropped.labels("too_small").inc(4)
    m.groups_zero_variance.inc(12)
    m.group_rollouts.inc(9876)
    m.group_rollouts_late.inc(5)
    m.group_rollouts_duplicate.inc(6)
    m.group_rollouts_truncated.inc(7)
    for size, spread in ((4, 0.0), (11, 0.84)):
        m.group_size.observe(size)
        m.group_reward_spread.observe(spread)
    m.observe_version_rewards({0: [0.0, 0.0, 0.25, 0.0], 3: [1.0, 0.5], 1: [0.5]})
    return status.groups(status.collect(m.registry, status.GROUP_FAMILIES))


def test_the_groups_summary_reads_every_group_family() -> None:
    assert groups_stage_numbers() == {
        "open": 17,
        "closed": {"size": 1200, "timeout": 34},
        "incomplete": 30,
        "dropped": {"too_small": 4, "zero_variance": 0, "too_large": 0},
        "zero_variance": 12,
        "rollouts": 9876,
        "late": 5,
        "duplicate": 6,
        "truncated": 7,
        "mean_size": 7.5,
        "mean_reward_spread": 0.42,
        "reward_curve": [
            {"version": 0, "mean_reward": 0.0625, "rollouts": 4},
            {"version": 1, "mean_reward": 0.5, "rollouts": 1},
            {"version": 3, "mean_reward": 0.75, "rollouts": 2},
        ],
    }


def test_the_learning_curve_is_the_mean_reward_by_serving_version() -> None:
    """From a group's rollouts (their oldest serving version; a truncated, an
    unrewarded or an unversioned one left out) to the points the page plots."""
    rollouts = [
        tool_episode("a", versions=(2, 3), reward=1.0),  # served by 2 and 3: counts for 2
        tool_episode("b", versions=(2, 2), reward=0.0),
        tool_episode("c", versions=(5, 5), reward=0.5),
        msgspec.structs.replace(tool_episode("d", versions=(5, 5)), truncated=True),
        tool_episode("e", versions=(5, 5), reward=None),
        tool_episode("f", versions=("abc", "abc"), reward=1.0),
    ]
    assert records.rewards_by_version(rollouts) == {2: [1.0, 0.0], 5: [0.5]}
    m = Metrics()
    m.observe_version_rewards(records.rewards_by_version(rollouts))
    m.observe_version_rewards({2: [0.5], 7: [sys.float_info.max, sys.float_info.max]})
    curve = status.reward_curve(status.collect(m.registry, status.GROUP_FAMILIES))
    assert curve == [
        {"version": 2, "mean_reward": 0.5, "rollouts": 3},
        {"version": 5, "mean_reward": 0.5, "rollouts": 1},
        {"version": 7, "mean_reward": SPREAD_CAP, "rollouts": 2},  # the sum stays finite
    ]


def test_the_learning_curve_keeps_the_newest_versions_only() -> None:
    m = Metrics()
    for version in range(CURVE_VERSIONS + 5):
        m.observe_version_rewards({version: [1.0]})
    m.observe_version_rewards({2: [1.0]})  # older than every version kept: not a series again
    curve = status.reward_curve(status.collect(m.registry, status.GROUP_FAMILIES))
    assert [p["version"] for p in curve] == list(range(5, CURVE_VERSIONS + 5))


def test_with_groups_enabled_the_page_shows_the_groups_stage(tmp_path: Path) -> None:
    dom = rendered(STATUS | {"groups": groups_stage_numbers()}, tmp_path)
    assert '<section id="groups">' in dom
    shown = {
        "groups_open": "17",
        "groups_closed": "1,234",
        "groups_closed_detail": "1,200 size, 34 timeout",
        "groups_incomplete": "30",
        "groups_dropped": "4 too_small dropped",
        "groups_zero_variance": "12",
        "groups_late": "5",
        "groups_rollouts": "9,876 rollouts, 6 duplicate, 7 truncated",
        "groups_mean_size": "7.5",
        "groups_mean_spread": "0.42",
        "reward_detail": "3 versions; v3: 0.75 over 2 rollouts",
    }
    assert {card: dom_text(dom, card) for card in shown} == shown
    # the curve: x from v0 to v3 over 44..626, y from 1 (at 10) to 0 (at 190)
    points = re.findall(r'<circle [^>]*cx="([\d.]+)" cy="([\d.]+)"[^>]*data-version="(\d+)"', dom)
    assert [(round(float(x)), round(float(y)), v) for x, y, v in points] == [
        (44, 179, "0"),
        (238, 100, "1"),
        (626, 55, "3"),
    ]
    assert re.search(r'<polyline id="reward_line" [^>]*points="44,178.75 238,100 626,55"', dom)
    assert "<title>v3: 0.75 over 2 rollouts</title>" in dom
    assert ">v0</text>" in dom and ">v3</text>" in dom and ">weight version</text>" in dom


def test_before_any_versioned_rollout_the_plot_says_so(tmp_path: Path) -> None:
    groups = groups_stage_numbers() | {"reward_curve": []}
    dom = rendered(STATUS | {"groups": groups}, tmp_path)
    assert dom_text(dom, "reward_detail") == "no rollout with a weight version yet"
    assert "<circle" not in dom


def test_previews_are_off_unless_turned_on_and_an_unreadable_output_is_shown(
    tmp_path: Path,
) -> None:
    """Off (``recent_records`` null, as the worker sends by default): the table says
    so and shows no record; a folder where the manifest goes is reported, not raised."""
    dom = rendered(
        STATUS | {"recent_records": None, "output_error": "IsADirectoryError: x"}, tmp_path
    )
    assert table(dom, "recent") == [
        ["off: previews show episode ids and content (http.record_previews=true turns them on)"]
    ]
    assert '{"prompt"' not in dom
    assert dom_text(dom, "output_error") == "output unreadable: IsADirectoryError: x"


def test_markup_in_a_record_or_a_name_is_shown_as_text(tmp_path: Path) -> None:
    evil = '<img src=x onerror="document.title=1"><script>document.title=2</script>'
    record = {"file": evil, "bytes": 9, "preview": evil}
    dom = rendered(STATUS | {"worker_id": evil, "recent_records": [record]}, tmp_path)
    assert "<img" not in dom and "&lt;img src=x" in dom
    assert "<title>stream-export status</title>" in dom


def test_every_answer_carries_the_security_headers_and_the_page_runs_under_its_policy(
    tmp_path: Path,
) -> None:
    """The policy admits the page's own inline script and style by hash: the page
    renders in Chromium (the other tests) and nothing else could run."""
    page = resources.files("stream_export.ops").joinpath("status.html").read_text()
    snap = http.Snapshot(
        taken=time.monotonic() + 3600,
        ready=True,
        checks={},
        readyz=b"{}",
        status=msgspec.json.encode(STATUS),
    )
    servers = [
        http.Server("127.0.0.1", free_port(), Metrics().registry, lambda: snap, page),
        http.ProbeServer("127.0.0.1", free_port(), lambda: snap),
    ]
    for server in servers:
        asyncio.run(server.start())
    try:
        for server in servers:
            for path in (*http.PATHS, "/nowhere"):
                _, headers = head(f"http://127.0.0.1:{server.port}{path}")
                assert headers["X-Frame-Options"] == "DENY", path
                assert headers["X-Content-Type-Options"] == "nosniff", path
                assert headers["Referrer-Policy"] == "no-referrer", path
                policy = headers["Content-Security-Policy"]
                assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
        policy = head(f"http://127.0.0.1:{servers[0].port}/")[1]["Content-Security-Policy"]
        assert re.search(r"script-src 'sha256-[A-Za-z0-9+/]+=*'; style-src 'sha256-", policy)
        assert "unsafe-inline" not in policy and "connect-src 'self'" in policy
    finally:
        for server in servers:
            asyncio.run(server.stop())


def head(url: str) -> tuple[int, dict[str, str]]:
    """Status and headers of a GET (an error status too)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers)
