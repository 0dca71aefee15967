"""`stream-export learn`: the live loop on the log. Agents on the OpenAI SDK play the
user's tasks through the gateway, the worker groups their episodes, and a trainer
process learns from the feed and loads each new policy behind the weight fence."""
