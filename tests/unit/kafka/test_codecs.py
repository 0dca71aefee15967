"""The worker reads a batch in every codec a Kafka producer may compress with: gzip,
snappy (franz-go's default), lz4 and zstd. Without the codec, aiokafka raises
UnsupportedCodecError while fetching and the worker stops (the end-to-end case:
tests/integration/docs/test_send_events.py, franz-go with its defaults)."""

from __future__ import annotations

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords

CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


@pytest.mark.parametrize("codec", CODECS)
def test_a_compressed_batch_reads_back_as_sent(codec: str) -> None:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=CODECS[codec],
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    sent = [(b"episode-1", b'{"type":"step","seq":%d}' % i) for i in range(3)]
    for offset, (key, value) in enumerate(sent):
        builder.append(offset, timestamp=None, key=key, value=value, headers=[])
    batch = MemoryRecords(bytes(builder.build())).next_batch()
    assert batch is not None and batch.compression_type == CODECS[codec]
    assert [(r.key, r.value) for r in batch] == sent
