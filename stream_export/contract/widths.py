"""The numeric types the outputs declare, and the contract's numbers bounded to them.

Every number a worker writes lands in a column whose type the dataset card and
the Parquet schema declare (``rows/schema.py`` builds its Arrow types from the
names here): token ids are ``int32``, logprobs ``float32``, every other integer
``int64``, every other float ``float64``. A value its type cannot hold (a token
id of 2^31, a seq of 2^64, a logprob of 1e39) would make every reader of the
folder fail, or turn into infinity, so the contract's fields are these bounded
types and the decoders reject such a value as ``out_of_range`` (one message
costs only itself). Pure: no Arrow here.
"""

from __future__ import annotations

import sys
from typing import Annotated, Final

import msgspec

#: Arrow's names of the declared types (``pyarrow.type_for_alias``).
TOKEN_ID_TYPE: Final = "int32"
LOGPROB_TYPE: Final = "float32"
INTEGER_TYPE: Final = "int64"
FLOAT_TYPE: Final = "float64"

INT32_MAX: Final = 2**31 - 1
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
#: The largest finite float32: a larger magnitude becomes infinity in the column.
FLOAT32_MAX: Final = 3.4028234663852886e38
#: The largest finite float64 (JSON has no infinity).
FLOAT64_MAX: Final = sys.float_info.max
#: Every bound above, as a decoder's message shows it: what tells a number out of
#: its declared range from any other invalid value.
LIMITS: Final = frozenset({INT32_MAX, INT64_MIN, INT64_MAX, FLOAT32_MAX, -FLOAT32_MAX})

#: A token id: what an ``int32`` column holds (no vocabulary comes near 2^31).
TokenId = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
#: A logprob: what a ``float32`` column holds as a finite number.
Logprob = Annotated[float, msgspec.Meta(ge=-FLOAT32_MAX, le=FLOAT32_MAX)]
#: Any other integer the outputs write (an ``int64`` column).
Int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
#: A count or index (seq, steps): zero or more, within ``int64``.
Index = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]


def bounded(value: float) -> float:
    """``value`` clamped to the finite floats (a difference of two rewards can
    overflow to infinity)."""
    return max(-FLOAT64_MAX, min(value, FLOAT64_MAX))
