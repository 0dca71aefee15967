"""Faust's transport, with the patched consumer and producer: what ``faust.App``
is given (``runtime/app.py``)."""

from __future__ import annotations

from collections.abc import Mapping

import faust
from faust.transport.drivers import aiokafka as faust_kafka

from stream_export.runtime.patches import consumer, producer
from stream_export.runtime.patches.consumer import Batches


class Transport(faust_kafka.Transport):
    Consumer = consumer.Consumer
    Producer = producer.Producer
    #: Where the consumer hands the records of each batch topic (:func:`take_batches`).
    batches: Mapping[str, Batches] = {}


def take_batches(app: faust.App, batches: Batches) -> None:
    """Hand the records of ``batches.topic`` to ``batches`` once the worker runs."""
    transport = app.transport
    assert isinstance(transport, Transport), "not the patched transport"
    transport.batches = {**transport.batches, batches.topic: batches}
