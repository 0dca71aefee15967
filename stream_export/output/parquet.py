"""Parquet as an encoding of a sealed file (``sink.encoding = "parquet"``).

The active file stays JSON lines (tailed, truncated back to its checkpoint after a
crash: the exactly-once rules do not change); sealing transcodes it into one
Parquet file with the output's schema (``schema``), as compression would, so the
seal protocol, its write-ahead log and the manifest are the ones of JSONL.

Arrow's JSON reader does the work off the GIL. A weight version is an integer or a
string as the server sent it, so those columns are read as found and cast to
text; a file Arrow cannot read in one pass (both kinds of weight version in one
column, a line longer than a block) goes through msgspec instead, row by row.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

import msgspec

from stream_export.errors import SinkError

if TYPE_CHECKING:
    import pyarrow as pa

#: The columns whose JSON is an integer or a string (or a list of them): Parquet keeps
#: them as text.
_AS_TEXT: Final = frozenset({"weight_version_min", "weight_version_max", "call_weight_versions"})
_BLOCK: Final = 16 << 20
_ROWS: Final = 4096


def _batches_arrow(src: Path, columns: pa.Schema) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa
    import pyarrow.json as pj

    typed = pa.schema([f for f in columns if f.name not in _AS_TEXT])
    options = pj.ParseOptions(explicit_schema=typed, unexpected_field_behavior="infer")
    read = pj.ReadOptions(block_size=_BLOCK)
    for batch in pj.open_json(src, read_options=read, parse_options=options):
        yield _conform(pa.Table.from_batches([batch]), columns)


def _conform(table: pa.Table, columns: pa.Schema) -> pa.RecordBatch:
    """``table`` with exactly ``columns``: absent ones null, text ones cast."""
    import pyarrow as pa

    extra = set(table.column_names) - set(columns.names)
    if extra:
        raise SinkError(f"columns {sorted(extra)} are not in the output's schema")
    arrays = []
    for field in columns:
        if field.name not in table.column_names:
            arrays.append(pa.nulls(table.num_rows, field.type))
        else:
            arrays.append(table.column(field.name).cast(field.type).combine_chunks())
    return pa.RecordBatch.from_arrays(arrays, schema=columns)


def _batches_python(src: Path, columns: pa.Schema) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa

    names = set(columns.names)
    rows: list[dict[str, Any]] = []
    with src.open("rb") as fh:
        for line in fh:
            row = msgspec.json.decode(line)
            if not names.issuperset(row):
                raise SinkError(f"columns {sorted(set(row) - names)} are not in the schema")
            for name in _AS_TEXT.intersection(row):
                value = row[name]
                if isinstance(value, list):
                    row[name] = [str(v) for v in value]
                elif value is not None:
                    row[name] = str(value)
            rows.append(row)
            if len(rows) == _ROWS:
                yield pa.RecordBatch.from_pylist(rows, schema=columns)
                rows = []
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=columns)


def transcode(src: Path, dst: IO[bytes], columns: pa.Schema, codec: str) -> None:
    """Write the JSON lines of ``src`` to ``dst`` as one Parquet file of ``columns``,
    the rows in file order (an empty file gives a file of no rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for batches in (_batches_arrow, _batches_python):
        out = io.BytesIO()
        try:
            with pq.ParquetWriter(out, columns, compression=codec) as writer:
                for batch in batches(src, columns):
                    writer.write_batch(batch)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            if batches is _batches_python:
                raise
            continue
        dst.write(out.getbuffer())
        return


_encoder: Final = msgspec.json.Encoder()


def lines(path: Path) -> Iterator[bytes]:
    """The rows of a sealed Parquet file as JSON lines (without newline), in order:
    what ``follow`` and the other line readers read (float32 columns as float32
    values, weight versions as text). Opens the file before it returns (a missing
    file raises FileNotFoundError here)."""
    import pyarrow.parquet as pq

    return _rows(pq.ParquetFile(path))


def _rows(parquet: Any) -> Iterator[bytes]:
    with parquet:
        for batch in parquet.iter_batches(batch_size=_ROWS):
            for row in batch.to_pylist():
                yield _encoder.encode(row)
