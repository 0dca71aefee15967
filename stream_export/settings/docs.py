"""Every setting described from the one Settings object, and the effective settings
as TOML: what ``stream-export config list`` and ``config show`` print.

Names, types, defaults, bounds and environment names come from the msgspec
structs in :mod:`stream_export.settings`; each description is the ``#:`` comment
above the field there (read from the source, as documentation tools do), so no
list of settings is kept anywhere else.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import typing
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from stream_export.settings import Settings
from stream_export.settings.values import Secret, allowed, env_name, unwrap

_FIELD = re.compile(r"^\s+(\w+)\s*:")
_DOC = re.compile(r"^\s+#:\s?(.*)$")


@dataclass(frozen=True)
class Setting:
    key: str
    env: str
    kind: str
    default: Any
    allowed: str
    doc: str


def _kind(annotation: Any) -> str:
    bare, optional, _ = unwrap(annotation)
    origin = typing.get_origin(bare)
    if origin is Literal:
        name = "choice"
    elif origin is list:
        name = "list of strings"
    elif bare is Secret:
        name = "secret"
    else:
        name = {bool: "boolean", int: "integer", float: "number"}.get(bare, "string")
    return f"{name} or none" if optional else name


@functools.cache
def _docs(cls: type) -> dict[str, str]:
    """field -> the ``#:`` comment lines right above it in the class body."""
    docs: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(cls).splitlines():
        comment, field = _DOC.match(line), _FIELD.match(line)
        if comment:
            pending.append(comment.group(1))
            continue
        if field and pending:
            docs[field.group(1)] = " ".join(pending)
        pending = []
    return docs


def _default(field: msgspec.structs.FieldInfo) -> Any:
    if field.default_factory is not msgspec.NODEFAULT:
        return field.default_factory()
    return field.default


def settings() -> list[Setting]:
    """Every setting, section by section in the order of ``Settings``."""
    out = []
    for section in msgspec.structs.fields(Settings):
        cls = section.type
        for f in msgspec.structs.fields(cls):
            out.append(
                Setting(
                    key=f"{section.name}.{f.name}",
                    env=env_name(section.name, f.name),
                    kind=_kind(f.type),
                    default=_default(f),
                    allowed=allowed(f.type),
                    doc=_docs(cls).get(f.name, ""),
                )
            )
    return out


def value(v: Any) -> str:
    """A value as TOML (JSON's spelling of strings, numbers, booleans and string
    lists is valid TOML); a Secret as ``"***"``."""
    if isinstance(v, Secret):
        return '"***"'
    return json.dumps(v, ensure_ascii=False)


def render_list() -> str:
    """``config list``: one block per setting."""
    blocks = []
    for s in settings():
        default = "none" if s.default is None else value(s.default)
        if s.key == "worker.worker_id":
            default += " (the host name)"
        lines = [
            f"{s.key}  ({s.env})",
            f"    {s.kind}, default {default}",
            f"    allowed: {s.allowed}",
        ]
        if s.doc:
            lines.append(f"    {s.doc}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def render_effective(current: Settings, sources: dict[str, str]) -> str:
    """``config show``: the effective settings as a TOML file ``--config`` accepts
    again (a setting that is not set is a comment), each non-default value with
    where it came from; secrets are ``***``."""
    lines = [
        "# stream-export settings in effect: defaults < TOML file < environment < --set",
        "# (secrets are shown as ***)",
    ]
    for section in msgspec.structs.fields(Settings):
        lines += ["", f"[{section.name}]"]
        values = getattr(current, section.name)
        for f in msgspec.structs.fields(section.type):
            key = f"{section.name}.{f.name}"
            v = getattr(values, f.name)
            where = f"  # from {sources[key]}" if key in sources else ""
            if v is None:
                lines.append(f"# {f.name} = (not set){where}")
            else:
                lines.append(f"{f.name} = {value(v)}{where}")
    return "\n".join(lines) + "\n"
