"""Nested metadata made flat: what the gateway's session API accepts besides the
contract's ``Metadata`` (scalars and lists of scalars, which columns,
``metadata_fields``, ``domains``, Parquet and the JSON Schemas rely on).

The rule (pure):

* an object's keys join their parent's with ``.``: ``{"args": {"room": {"name":
  "cellar"}}}`` becomes ``{"args.room.name": "cellar"}``; an empty object adds
  nothing;
* a list of scalars stays a list; a list holding an object or a list becomes its
  compact JSON text (``{"args.steps": "[{\\"x\\":1}]"}``);
* a flattened key that exists already (``{"a.b": 1, "a": {"b": 2}}``) is an error
  naming it: a value is never overwritten silently.

Depth is bounded where the JSON is read (the gateway's edge: 64 levels).
"""

from __future__ import annotations

import json
from typing import Any

from stream_export.contract.events import Metadata, Scalar


def flatten(metadata: Any) -> Metadata | None:
    """``metadata`` flat (None stays None); ValueError when it is not an object or
    two keys flatten to one."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise ValueError("metadata must be a JSON object")
    out: Metadata = {}
    _into(out, metadata, "")
    return out


def _into(out: Metadata, value: dict[str, Any], prefix: str) -> None:
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, dict):
            _into(out, item, name + ".")
            continue
        if name in out:
            raise ValueError(f"metadata key {name!r} is given twice (once nested)")
        out[name] = _flat_value(item)


def _flat_value(value: Any) -> Scalar | list[Scalar]:
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    result: Scalar | list[Scalar] = value
    return result
