"""Logs and metrics as every process of the project writes them (the worker, the
gateway, the trainer feed): structured log lines, and the metric conventions.
No Faust here, so the gateway and the feed use them without the worker's runtime.
"""
