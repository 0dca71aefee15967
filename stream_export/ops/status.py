"""What the status page shows, read from the metrics registry and the output folder.

Pure reading: the samples of the registry (:func:`collect`), rates and recent
error counts over sliding windows, the sealed files of the manifest, the tail
of the newest active file (only with ``http.record_previews``: records hold ids and
content), and the groups stage's summary. ``stream_export.ops.http`` turns these
into the /status.json document once a second and serves it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import msgspec
from prometheus_client import CollectorRegistry

from stream_export.output.layout import ManifestEntry, manifest_path, read_checkpoint

#: Throughput on the status page is averaged over this many seconds.
RATE_WINDOW_S = 10.0
#: Recent errors on the status page: those of the last this many seconds.
ERROR_WINDOW_S = 300.0
RECENT_RECORDS = 5
PREVIEW_CHARS = 160
_TAIL_BYTES = 64 * 1024

#: Sample name -> (labels, value) of every sample, read from the registry once.
Samples = dict[str, list[tuple[dict[str, str], float]]]

#: The families the status page reads (collecting only these skips the histograms).
STATUS_FAMILIES = (
    "stream_export_events_consumed",
    "stream_export_episodes_emitted",
    "stream_export_records_written",
    "stream_export_bytes_written",
    "stream_export_open_episodes",
    "stream_export_consumer_lag_messages",
    "stream_export_events_invalid",
    "stream_export_dead_letters",
    "stream_export_sink_errors",
    "stream_export_format_errors",
    "stream_export_sink_paused",
    "stream_export_last_write_timestamp_seconds",
)

#: The groups stage's families (stream_export.groups.stage), read when it runs.
GROUP_FAMILIES = (
    "stream_export_groups_open",
    "stream_export_groups_closed",
    "stream_export_groups_incomplete",
    "stream_export_groups_dropped",
    "stream_export_groups_zero_variance",
    "stream_export_group_rollouts",
    "stream_export_group_rollouts_late",
    "stream_export_group_rollouts_duplicate",
    "stream_export_group_rollouts_truncated",
    "stream_export_group_size_rollouts",
    "stream_export_group_reward_spread",
    "stream_export_group_rollout_reward",
)

#: Error kind on the status page -> (counter sample, its reason label or None).
ERRORS: dict[str, tuple[str, str | None]] = {
    "dead_letters": ("stream_export_dead_letters_total", "reason"),
    "invalid": ("stream_export_events_invalid_total", "reason"),
    "sink": ("stream_export_sink_errors_total", "kind"),
    "format": ("stream_export_format_errors_total", None),
}
ERROR_FAMILIES = [name.removesuffix("_total") for name, _ in ERRORS.values()]

PAUSED = "stream_export_sink_paused"
UPLOAD_PAUSED = "stream_export_upload_paused"


def collect(registry: CollectorRegistry, families: Iterable[str] = ()) -> Samples:
    """Every sample of ``registry`` (or of the named families only), by sample name."""
    names = list(families)
    source = registry.restricted_registry(_sample_names(names)) if names else registry
    out: Samples = {}
    for family in source.collect():
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _sample_names(families: list[str]) -> list[str]:
    """Sample names of the families, with a histogram's sum and count (not its buckets)."""
    return [f + suffix for f in families for suffix in ("", "_total", "_sum", "_count")]


def total(samples: Samples, name: str) -> float:
    """Sum of every sample called ``name`` (all label values)."""
    return sum(v for _, v in samples.get(name, ()))


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, v in samples.get(name, ()):
        if label in labels:
            out[labels[label]] = out.get(labels[label], 0.0) + v
    return out


def recent_records(directory: str, prefix: str, n: int = RECENT_RECORDS) -> list[dict[str, Any]]:
    """The last ``n`` records of the most recently written active file (up to the
    length its checkpoint names: whole, committed lines), as short previews."""
    root = Path(directory)
    ckpt = read_checkpoint(root, prefix)
    written = []
    for state in ckpt.active.values() if ckpt else ():
        path = root / state.path
        with contextlib.suppress(FileNotFoundError):
            if state.length:
                written.append((path.stat().st_mtime, path, state.length))
    if not written:
        return []
    _, newest, size = max(written)
    with newest.open("rb") as fh:
        fh.seek(max(0, size - _TAIL_BYTES))
        tail = fh.read(min(size, _TAIL_BYTES)).split(b"\n")
    lines = [line for line in tail[1 if size > _TAIL_BYTES else 0 : -1] if line][-n:]
    return [
        {
            "file": newest.name,
            "bytes": len(line) + 1,
            "preview": line[: PREVIEW_CHARS * 4].decode("utf-8", "replace")[:PREVIEW_CHARS],
        }
        for line in reversed(lines)
    ]


class Window:
    """The increase of some counters over a sliding window of samples."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.points: deque[tuple[float, dict[str, float]]] = deque()

    def add(self, now: float, values: dict[str, float]) -> None:
        self.points.append((now, values))
        while len(self.points) > 2 and now - self.points[1][0] >= self.window_s:
            self.points.popleft()

    def span(self) -> float:
        return self.points[-1][0] - self.points[0][0] if len(self.points) > 1 else 0.0

    def increase(self) -> dict[str, float]:
        """Per counter, last minus first sample (a counter new since then counts from 0)."""
        if not self.points:
            return {}
        first, last = self.points[0][1], self.points[-1][1]
        return {k: v - first.get(k, 0.0) for k, v in last.items()}


class Throughput:
    """Per-second rates of a few counters over a sliding window."""

    COUNTERS: ClassVar[dict[str, str]] = {
        "events_per_s": "stream_export_events_consumed_total",
        "records_per_s": "stream_export_records_written_total",
        "bytes_per_s": "stream_export_bytes_written_total",
    }

    def __init__(self, registry: CollectorRegistry, window_s: float = RATE_WINDOW_S) -> None:
        self.registry = registry
        self.window = Window(window_s)

    @property
    def points(self) -> deque[tuple[float, dict[str, float]]]:
        return self.window.points

    def sample(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        samples = collect(self.registry, [n.removesuffix("_total") for n in self.COUNTERS.values()])
        self.window.add(now, {k: total(samples, n) for k, n in self.COUNTERS.items()})

    def rates(self) -> dict[str, float]:
        span = self.window.span()
        if not span:
            return dict.fromkeys(self.COUNTERS, 0.0)
        return {k: round(v / span, 3) for k, v in self.window.increase().items()}


def error_counts(samples: Samples) -> dict[str, float]:
    """Every error counter by "kind" or "kind/reason" (see ERRORS)."""
    out: dict[str, float] = {}
    for kind, (name, label) in ERRORS.items():
        if label is None:
            out[kind] = total(samples, name)
        else:
            for reason, n in by_label(samples, name, label).items():
                out[f"{kind}/{reason}"] = n
    return out


def error_rows(totals: dict[str, float], recent: dict[str, float], span_s: float) -> list[Any]:
    """The errors that ever happened: kind, reason, total, count and rate per minute
    over the recent window (most recent first, then by total)."""
    rows = []
    for key, n in totals.items():
        if n:
            kind, _, reason = key.partition("/")
            last = recent.get(key, 0.0)
            per_min = round(60 * last / span_s, 2) if span_s else 0.0
            rows.append(
                {"kind": kind, "reason": reason, "total": n, "recent": last, "per_min": per_min}
            )
    return sorted(rows, key=lambda r: (-r["recent"], -r["total"], r["kind"], r["reason"]))


class SealedFiles:
    """Count and size of the sealed files in the sink's manifest, read incrementally
    (only the lines appended since the last call)."""

    def __init__(self, root: str, prefix: str) -> None:
        self.path = manifest_path(Path(root), prefix)
        self.offset = 0
        self.files = 0
        self.bytes = 0
        self.newest: ManifestEntry | None = None

    def update(self) -> dict[str, Any]:
        """Read the lines appended since the last call; return the summary."""
        try:
            with self.path.open("rb") as fh:
                if fh.seek(0, os.SEEK_END) < self.offset:  # replaced: count again
                    self.offset = self.files = self.bytes = 0
                    self.newest = None
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            data = b""
        complete = data[: data.rfind(b"\n") + 1]
        for line in complete.splitlines():
            entry = msgspec.json.decode(line, type=ManifestEntry)
            self.files, self.bytes, self.newest = self.files + 1, self.bytes + entry.bytes, entry
            self.offset += len(line) + 1
        return self.summary()

    def summary(self) -> dict[str, Any]:
        """What the lines read so far say."""
        newest = self.newest
        return {
            "files": self.files,
            "bytes": self.bytes,
            "newest": newest.name if newest else None,
            "newest_sealed_at": newest.sealed_at if newest else None,
        }


def _existing(directory: str) -> Path:
    """The directory, or the nearest ancestor that exists (the one that will hold it)."""
    path = Path(directory).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def writable(directory: str) -> bool:
    """Whether the output directory (or the ancestor that will hold it) is a writable folder."""
    path = _existing(directory)
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def disk_space(directory: str) -> dict[str, int] | None:
    """Free and total bytes of the file system holding ``directory`` (or the
    ancestor that will hold it); None if there is none."""
    try:
        usage = shutil.disk_usage(_existing(directory))
    except OSError:
        return None
    return {"free_bytes": usage.free, "total_bytes": usage.total}


class Disk(NamedTuple):
    """The output folder as the status page shows it."""

    #: None: previews are off (``http.record_previews``).
    recent: list[dict[str, Any]] | None
    sealed: dict[str, Any]
    space: dict[str, int] | None
    #: What could not be read (a folder where the manifest goes, no descriptor
    #: left, a damaged line): shown, never raised.
    error: str | None = None


def _mean(samples: Samples, histogram: str) -> float | None:
    """A histogram's mean since start (None before its first observation)."""
    count = total(samples, f"{histogram}_count")
    return round(total(samples, f"{histogram}_sum") / count, 3) if count else None


def groups(samples: Samples) -> dict[str, Any]:
    """The groups stage in numbers: open groups, groups closed by reason, and the
    counts an operator watches (incomplete, dropped, zero-variance, late rollouts),
    with the mean size and reward spread of the groups emitted."""
    p = "stream_export_group"
    return {
        "open": total(samples, f"{p}s_open"),
        "closed": by_label(samples, f"{p}s_closed_total", "reason"),
        "incomplete": total(samples, f"{p}s_incomplete_total"),
        "dropped": by_label(samples, f"{p}s_dropped_total", "reason"),
        "zero_variance": total(samples, f"{p}s_zero_variance_total"),
        "rollouts": total(samples, f"{p}_rollouts_total"),
        "late": total(samples, f"{p}_rollouts_late_total"),
        "duplicate": total(samples, f"{p}_rollouts_duplicate_total"),
        "truncated": total(samples, f"{p}_rollouts_truncated_total"),
        "mean_size": _mean(samples, f"{p}_size_rollouts"),
        "mean_reward_spread": _mean(samples, f"{p}_reward_spread"),
        "reward_curve": reward_curve(samples),
    }


def reward_curve(samples: Samples) -> list[dict[str, Any]]:
    """Mean reward of the rollouts by the weight version that served them, oldest
    version first (the status page plots it; empty while no rollout had one)."""
    name = "stream_export_group_rollout_reward"
    sums = by_label(samples, f"{name}_sum", "weight_version")
    counts = by_label(samples, f"{name}_count", "weight_version")
    points = [
        (int(version), sums.get(version, 0.0) / n, int(n))
        for version, n in counts.items()
        if n and version.lstrip("-").isdigit()
    ]
    return [
        {"version": v, "mean_reward": round(mean, 4), "rollouts": n}
        for v, mean, n in sorted(points)
    ]
