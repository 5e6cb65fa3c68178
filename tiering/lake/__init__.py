"""Lake tables: Fluvial tables materialized into Apache Iceberg by tiering jobs.

`catalog` (where lake tables live, offsets of a snapshot), `schema` (column mapping),
`writer` (data files, per-key reduction, the round's commit), `coordinator` and `actions`
(the broker's side: leases and Flight actions), `job` (a tiering round and the worker
loop), `spark_job` (the round on Spark), `cli` (`fluvial lake ...`).
"""
