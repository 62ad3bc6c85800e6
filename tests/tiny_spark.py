"""Spark settings for tables of a few dozen rows: the test suite and the randomized schedules.

Spark's per-query overheads, not the data, are the cost there. Adaptive execution re-plans every
shuffle and whole-stage codegen compiles every new query shape; both only pay on real data.
Measured: 3 chaos schedules 64 s -> 47 s. Never for production (the sink keeps both on).
"""

TINY_DATA_CONF = {
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.databricks.delta.snapshotPartitions": "1",
    # A VACUUM the tests run themselves (a foreign maintenance commit) lists the table with this
    # many tasks: 10,000 by default, 45 s of empty tasks (the sink's own vacuum sets it per call).
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
}
