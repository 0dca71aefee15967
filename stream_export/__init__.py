"""stream-export: live LLM-agent step events on Kafka -> GRPO training records in JSONL."""

from stream_export import moved

__version__ = "0.1.0"

moved.install()
