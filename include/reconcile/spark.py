"""SparkSession construction for the embedded default and for spark-submit.

Under spark-submit the session's master and jars come from the submit command; locally
(tests, the demo, the CLI) Delta's jars come from ``RECONCILE_SPARK_JARS`` or ``.jars/``
(see scripts/fetch_jars.sh), else from Maven through ``spark.jars.packages``.
"""

from __future__ import annotations

import os
import sys

from reconcile import settings

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # The sink relies on reading its own commits' metadata; keep commit info on.
    "spark.databricks.delta.commitInfo.enabled": "true",
}

LOCAL_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.databricks.delta.snapshotPartitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.memory": "2g",
}


def submit_conf() -> dict[str, str]:
    """Spark conf for spark-submit of the jobs/ scripts (used by the DAG's operators)."""
    conf = dict(DELTA_CONF)
    jars = settings.spark_jars()
    if jars:
        conf["spark.jars"] = ",".join(jars)
    else:
        conf["spark.jars.packages"] = settings.DELTA_PACKAGES
    conf.update({k: v for k, v in LOCAL_CONF.items() if k != "spark.driver.memory"})
    # The driver runs the reconcile package: use the interpreter that has it installed.
    conf["spark.pyspark.driver.python"] = sys.executable
    return conf


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
    for k, v in {**DELTA_CONF, **(extra or {})}.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
