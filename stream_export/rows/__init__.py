"""Every output's rows, each shape defined once: how an episode reads, the built-in
formats and their metadata, token rows, the group outputs, their column types.

Pure (no I/O): the sinks write these rows, the dataset card and the Parquet files
take their types from here, and the trainer feed hands them out.
"""
