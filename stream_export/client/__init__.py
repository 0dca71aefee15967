"""The producer client for agents: episode recorders over an idempotent producer, no Faust."""

from stream_export.client.producer import Producer, SyncProducer, produce_lines
from stream_export.client.recorder import EpisodeRecorder, SyncEpisodeRecorder

__all__ = ["EpisodeRecorder", "Producer", "SyncEpisodeRecorder", "SyncProducer", "produce_lines"]
