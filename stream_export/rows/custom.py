"""Custom formatters: a function of the user's, found by ``package.module:function``
path or by name under the ``stream_export.formatters`` entry point, turning an
episode into its records (a dict, a list of dicts, or None to write nothing)."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module, metadata
from typing import Any, Final

from stream_export.contract.episode import Episode
from stream_export.errors import ConfigError, FormatError
from stream_export.rows.episode import Record
from stream_export.rows.formats import BUILTIN_FORMATS, Maker

#: What a custom formatter returns for one episode.
CustomResult = Record | list[Record] | None
CustomFormatter = Callable[[Episode], CustomResult]
ENTRY_POINT_GROUP: Final = "stream_export.formatters"


def load_custom(spec: str) -> CustomFormatter:
    """A custom formatter by ``package.module:function`` path or entry-point name."""
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
        try:
            target: Any = import_module(module_name)
            for part in attr.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"cannot load formatter {spec!r}: {exc}") from None
    else:
        found = metadata.entry_points(group=ENTRY_POINT_GROUP, name=spec)
        if not found:
            known = sorted(ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP))
            raise ConfigError(
                f"unknown format {spec!r}: not one of {', '.join(BUILTIN_FORMATS)}, not a "
                f"'package.module:function' path, and no {ENTRY_POINT_GROUP} entry point "
                f"(registered: {', '.join(known) or 'none'})"
            )
        try:
            target = next(iter(found)).load()
        except Exception as exc:
            raise ConfigError(f"cannot load formatter entry point {spec!r}: {exc}") from None
    if not callable(target):
        raise ConfigError(f"formatter {spec!r} is not callable")
    custom: CustomFormatter = target
    return custom


def custom_maker(function: CustomFormatter) -> Maker:
    def make(episode: Episode) -> list[Record]:
        result = function(episode)
        if result is None:
            return []
        if isinstance(result, dict):
            return [result]
        if isinstance(result, list) and all(isinstance(r, dict) for r in result):
            return result
        raise FormatError(
            f"returned {type(result).__name__}; expected a dict, a list of dicts or None"
        )

    return make
