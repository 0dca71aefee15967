"""The output folder's dataset card: ``README.md`` with the column types of every
output with sealed files (``schema``), so that ``datasets.load_dataset("<output_dir>")`` reads all
sealed files as one typed dataset, without ``features=``, whatever each file holds.

Hugging Face ``datasets`` reads a folder's ``README.md`` front matter: ``configs``
(which files make which dataset) and ``dataset_info.features`` (their types). JSON
is YAML, so the front matter is written as JSON. A ``README.md`` that stream-export
did not write (output_dir ``.`` in a project) is never touched.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import mode

from stream_export.output.durable import atomic_write
from stream_export.output.layout import PARQUET, SUFFIX, manifest_path
from stream_export.rows import schema
from stream_export.rows.columns import GROUP_OUTPUTS
from stream_export.settings import Settings
from stream_export.telemetry import logs

if TYPE_CHECKING:
    import pyarrow as pa

NAME: Final = "README.md"
MARKER: Final = "<!-- written by stream-export at each worker start; edits are replaced -->"
#: How often the worker refreshes the card (seconds).
INTERVAL_S: Final = 10.0
_DTYPES: Final = {"double": "float64", "float": "float32"}
log = logging.getLogger(__name__)


def _feature(name: str, kind: pa.DataType) -> dict[str, Any]:
    """One column in ``datasets``' YAML form (``Features._to_yaml_list``)."""
    import pyarrow as pa

    if pa.types.is_struct(kind):
        return {"name": name, "struct": [_feature(f.name, f.type) for f in kind]}
    if pa.types.is_list(kind):
        item = _feature(name, kind.value_type)
        del item["name"]
        return {"name": name, "list": next(iter(item.values()))}
    return {"name": name, "dtype": _DTYPES.get(str(kind), str(kind))}


def features(columns: pa.Schema) -> list[dict[str, Any]]:
    return [_feature(field.name, field.type) for field in columns]


def _files(prefix: str, encoding: str) -> list[str]:
    if encoding == "parquet":
        return [f"**/{prefix}-*{PARQUET}"]
    return [f"**/{prefix}-*.jsonl{suffix}" for suffix in SUFFIX.values()]


def outputs(settings: Settings) -> dict[str, tuple[str, pa.Schema]]:
    """Per ``datasets`` config name: the file prefix and the schema of each output
    that has one (``default`` is the episodes' records)."""
    prefix = settings.sink.prefix
    found = {}
    episodes = schema.episode_schema(settings.format)
    if episodes is not None:
        found["default"] = (prefix, episodes)
    if settings.groups.enabled:
        for name in GROUP_OUTPUTS:
            found[name] = (f"{prefix}.{name}", schema.group_schema(name))
    if settings.scores.enabled:
        found["scores"] = (f"{prefix}.scores", schema.score_schema())
    return found


def text(
    settings: Settings,
    sealed: Collection[str],
    known: dict[str, tuple[str, pa.Schema]] | None = None,
) -> str | None:
    """The card of the outputs named in ``sealed`` (None: none of them has a schema),
    among ``known`` (default: :func:`outputs`).

    ``datasets`` refuses a whole folder when one config matches no file, so a card
    names only outputs with a sealed file (a manifest)."""
    known = outputs(settings) if known is None else known
    found = {name: out for name, out in known.items() if name in sealed}
    if not found:
        return None
    front = {
        "configs": [
            {
                "config_name": name,
                "data_files": [{"split": "train", "path": _files(prefix, settings.sink.encoding)}],
            }
            for name, (prefix, _) in found.items()
        ],
        "dataset_info": [
            {"config_name": name, "features": features(columns)}
            for name, (_, columns) in found.items()
        ],
    }
    loads = "\n".join(
        f'datasets.load_dataset("{settings.sink.output_dir}"'
        + ("" if name == "default" else f', "{name}"')
        + ', split="train")'
        for name in found
    )
    return (
        f"---\n{json.dumps(front, indent=1)}\n---\n{MARKER}\n\n"
        "# stream-export training data\n\n"
        "The sealed files of this folder, read as typed datasets:\n\n"
        f"```python\nimport datasets\n{loads}\n```\n"
    )


class Card:
    """The card of one worker's outputs: their schemas built once, the file written
    when the set of outputs with sealed files changes."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.outputs = outputs(settings)
        self.root = Path(settings.sink.output_dir)
        self.sealed: list[str] | None = None

    def refresh(self) -> None:
        """Write the card into the output folder unless a README.md of someone else's
        is there; rewrite it only when it changed (workers sharing a folder agree)."""
        sealed = [
            name
            for name, (prefix, _) in self.outputs.items()
            if manifest_path(self.root, prefix).exists()
        ]
        if sealed == self.sealed:
            return
        card = text(self.settings, sealed, self.outputs)
        if card is not None:
            _write(self.root / NAME, card)
        self.sealed = sealed


def _write(path: Path, card: str) -> None:
    if path.exists():
        old = path.read_text(errors="replace")
        if old == card:
            return
        if MARKER not in old:
            logs.event(log, "card.skipped", logging.INFO, path=str(path))
            return
    atomic_write(path, card.encode())


def write(settings: Settings) -> None:
    """The card of ``settings``' outputs, written now (:meth:`Card.refresh`)."""
    Card(settings).refresh()


class Service(mode.Service):
    """Keeps the card current from the worker: an output's first sealed file adds it."""

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.card = Card(settings)

    async def on_started(self) -> None:
        self.refresh()

    @mode.Service.timer(INTERVAL_S)
    async def _refresh(self) -> None:
        self.refresh()

    def refresh(self) -> None:
        try:
            self.card.refresh()
        except OSError as exc:  # the sink reports the folder's trouble; the card waits
            logs.event(log, "card.unwritable", logging.WARNING, error=repr(exc))
