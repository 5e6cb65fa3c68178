"""Log tablets: per-bucket logs of Arrow IPC segments with offset and time indexes."""
