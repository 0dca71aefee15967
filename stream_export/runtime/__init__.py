"""What every stage runs on inside the worker: the Faust app, its private names, tables,
outbox, metrics, dead letters.
"""
