"""SparkSession construction for the embedded default and for spark-submit.

Under spark-submit the session's master and jars come from the submit command; locally
(tests, the demo, the CLI) Delta's jars come from ``RECONCILE_SPARK_JARS`` or ``.jars/``
(see scripts/fetch_jars.sh), else from Maven through ``spark.jars.packages``.
"""

from __future__ import annotations

import os
import sys

from reconcile import settings

# What the sink needs wherever it runs: Delta, and commit info (the sink reads its own commits'
# metadata); times in UTC.
SINK_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.commitInfo.enabled": "true",
    # the Delta protocol's timestamps (microseconds), not Parquet's legacy INT96: staged files
    # become table files as they are, and every Delta reader must read them
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
}

# The embedded default only (a session this process creates on local[*]): no UI, a driver that
# fits a laptop.
LOCAL_CONF = {
    "spark.ui.enabled": "false",
    "spark.driver.memory": "2g",
}

# Sized for one machine's cores; set at runtime on any session whose master is local[...]
# (a spark-submit job on local Spark too), unless the session was given its own value. A
# cluster keeps its defaults or what its operators configure.
LOCAL_SQL_CONF = {
    "spark.sql.shuffle.partitions": "8",
    "spark.databricks.delta.snapshotPartitions": "4",
}


def submit_conf() -> dict[str, str]:
    """Spark conf for spark-submit of the jobs/ scripts (the DAG's operators): what the sink
    needs, Delta's jars and the driver's interpreter; nothing tuned for one machine."""
    conf = dict(SINK_CONF)
    jars = settings.spark_jars()
    if jars:
        conf["spark.jars"] = ",".join(jars)
    else:
        conf["spark.jars.packages"] = settings.DELTA_PACKAGES
    # The driver runs the reconcile package: use the interpreter that has it installed.
    conf["spark.pyspark.driver.python"] = sys.executable
    return conf


def _tune_local(spark) -> None:
    if not spark.sparkContext.master.startswith("local"):
        return
    given = spark.sparkContext.getConf()
    for k, v in LOCAL_SQL_CONF.items():
        if not given.contains(k):
            spark.conf.set(k, v)


def get_session(app_name: str = "reconcile", extra: dict[str, str] | None = None):
    """The active session, else a new one. Under spark-submit (which starts the Python driver
    with PYSPARK_GATEWAY_PORT set) master and jars come from the submit command line; otherwise
    the embedded default's local settings apply."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder.appName(app_name)
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        builder = builder.master(settings.spark_master())
        jars = settings.spark_jars()
        if jars:
            builder = builder.config("spark.jars", ",".join(jars))
        else:
            builder = builder.config("spark.jars.packages", settings.DELTA_PACKAGES)
        for k, v in LOCAL_CONF.items():
            builder = builder.config(k, v)
    for k, v in {**SINK_CONF, **(extra or {})}.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    _tune_local(spark)
    return spark
