"""What trainers load from stream-export inside their own processes (no Faust, no
Kafka): verl's reward function for the exported parquet rows.
"""
