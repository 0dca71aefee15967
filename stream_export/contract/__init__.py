"""The contract: what crosses a topic, for producers and readers in any language.

Step events (``events``), model calls and their token segments (``calls``), scores
(``scores``), every dead-letter reason (``reasons``) and the numeric widths the
outputs declare (``widths``). The JSON Schemas in ``topics/schemas/`` are generated
from these types. Nothing here imports the rest of the project but its error root.
"""
