"""Stage 2, episodes -> files: formats and filters, the sink, the Writer and the on-disk layout
its readers share.
"""
