"""The trainer feed: batches of ready groups, episodes or token rows, acknowledged
after each training step (no Faust: it runs in the trainer's process)."""

from stream_export.feed.batches import Source
from stream_export.feed.consumer import Batch, Feed

__all__ = ["Batch", "Feed", "Source"]
