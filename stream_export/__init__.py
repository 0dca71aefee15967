"""stream-export: live LLM-agent step events on Kafka -> GRPO training records in JSONL."""

__version__ = "0.1.0"
