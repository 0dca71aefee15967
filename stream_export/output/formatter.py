"""The formatter a sink writes the episodes topic with: the filters, then the
format's records (built-in or custom), each encoded as one JSON line.

:func:`build` returns a :data:`Formatter` that turns one episode into the lines to
write (no trailing newline), an empty list when a filter drops the episode (counted
in ``episodes_filtered``), or raises FormatError (the sink dead-letters the
episode).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from stream_export.contract.episode import Episode
from stream_export.errors import FormatError
from stream_export.output import filters
from stream_export.rows.custom import custom_maker, load_custom
from stream_export.rows.formats import BUILTIN_FORMATS, Maker, builtin_maker, encode
from stream_export.runtime.metrics import Metrics
from stream_export.settings.format import FormatSettings

Formatter = Callable[[Episode], list[bytes]]
_MAX_SUMMARY: Final = 300


def _summary(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _MAX_SUMMARY else text[: _MAX_SUMMARY - 3] + "..."


def build(settings: FormatSettings, metrics: Metrics) -> Formatter:
    """The formatter for ``settings``; raises ConfigError for an unusable setting.

    Filtered episodes (and episodes a format has nothing to write for: reason
    "empty" for a built-in format without agent steps, "custom" when a custom
    formatter returns None or []) are counted in ``metrics.episodes_filtered``.
    Any failure while formatting raises FormatError with a short summary.
    """
    name = settings.format
    keep = filters.build(settings)
    make: Maker
    if name in BUILTIN_FORMATS:
        make = builtin_maker(settings)
        empty = "empty"
    else:
        make = custom_maker(load_custom(name))
        empty = "custom"
    filtered = metrics.episodes_filtered

    def format_episode(episode: Episode) -> list[bytes]:
        reason = keep(episode)
        if reason is not None:
            filtered.labels(reason).inc()
            return []
        try:
            lines = [encode(record) for record in make(episode)]
        except FormatError as exc:
            raise FormatError(f"formatter {name!r} {exc.detail}") from exc
        except Exception as exc:
            raise FormatError(f"formatter {name!r} failed: {_summary(exc)}") from exc
        if not lines:
            filtered.labels(empty).inc()
        return lines

    return format_episode
