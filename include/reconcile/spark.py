"""SparkSession construction: the embedded default, spark-submit, and Spark Connect.

Under spark-submit the session's master and jars come from the submit command; locally
(tests, the demo, the CLI) Delta's jars come from ``RECONCILE_SPARK_JARS`` or ``.jars/``
(see scripts/fetch_jars.sh), else from Maven through ``spark.jars.packages``. With
``RECONCILE_SPARK_REMOTE`` (or a ``remote`` argument) the session is a client of a long-lived
Spark Connect server (:mod:`reconcile.connect_server` starts one): no JVM in this process.
:func:`consumer_session` is a reader's: the sinks' tables by name.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

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
    # PySpark records the Python call site of every Column function by default: five py4j round
    # trips each, a second of an upsert batch's planning; the sink's errors name the sink and the
    # field instead
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}

# Local Spark is sized for the machine it runs on. In local mode the driver is the only executor:
# its heap holds every task's shuffle and join memory, so a fixed laptop-sized heap makes every
# wide shuffle of a few million rows spill. The driver gets half of the memory left after
# RESERVED_BYTES (Airflow's processes, the Python driver, the OS and its page cache), within
# [MIN_DRIVER_BYTES, MAX_DRIVER_BYTES]; shuffles get PARTITIONS_PER_CORE tasks per core
# (adaptive execution coalesces them on small data).
RESERVED_BYTES = 4 * 2**30
MIN_DRIVER_BYTES = 1 * 2**30
MAX_DRIVER_BYTES = 32 * 2**30
PARTITIONS_PER_CORE = 4


def machine_memory_bytes() -> int:
    """Physical memory, or this process's cgroup limit when it is lower (a container)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def machine_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def driver_memory(memory_bytes: int) -> str:
    """The local driver's heap for a machine of ``memory_bytes``, in MiB (Spark's ``<n>m``)."""
    heap = min(max((memory_bytes - RESERVED_BYTES) // 2, MIN_DRIVER_BYTES), MAX_DRIVER_BYTES)
    return f"{heap // 2**20}m"


def shuffle_partitions(cores: int) -> str:
    return str(PARTITIONS_PER_CORE * max(cores, 1))


def local_conf(environ=os.environ) -> dict[str, str]:
    """The embedded default's launch settings (a JVM this process starts on local[*], or a local
    Connect server): no UI, the machine's driver heap. Spark's own ``SPARK_DRIVER_MEMORY``, when
    set, replaces the heap (a session's ``spark.driver.memory`` conf too: it is applied after)."""
    conf = {"spark.ui.enabled": "false"}
    if not environ.get("SPARK_DRIVER_MEMORY"):
        conf["spark.driver.memory"] = driver_memory(machine_memory_bytes())
    return conf


LOCAL_CONF = local_conf()

# Sized for one machine's cores; set at runtime on any session whose master is local[...]
# (a spark-submit job on local Spark too), unless the session was given its own value. A
# cluster keeps its defaults or what its operators configure.
LOCAL_SQL_CONF = {
    "spark.sql.shuffle.partitions": shuffle_partitions(machine_cores()),
    "spark.databricks.delta.snapshotPartitions": "4",
    # A batch reads a shard's files by path (hundreds when laid out by key): a Spark job to list
    # them costs more than listing them in the driver.
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "1024",
}


LOG4J2_PROPERTIES = Path(__file__).with_name("spark-log4j2.properties")


def submit_conf() -> dict[str, str]:
    """Spark conf for spark-submit of the jobs/ scripts (the DAG's operators): what the sink
    needs, Delta's jars and the driver's interpreter; nothing tuned for one machine."""
    conf = {**SINK_CONF, **{f"spark.hadoop.{k}": v for k, v in settings.spark_store_conf().items()}}
    conf.update(settings.metastore_conf())
    jars = settings.spark_jars()
    if jars:
        conf["spark.jars"] = ",".join(jars)
    else:
        conf["spark.jars.packages"] = settings.DELTA_PACKAGES
    # The driver runs the reconcile package: use the interpreter that has it installed.
    conf["spark.pyspark.driver.python"] = sys.executable
    # Spark's INFO chatter stays out of the task log (RECONCILE_SPARK_LOG_LEVEL=info keeps it).
    level = os.environ.get("RECONCILE_SPARK_LOG_LEVEL", "warn").lower()
    conf["spark.driver.extraJavaOptions"] = (
        f"-Dlog4j2.configurationFile=file:{LOG4J2_PROPERTIES} -Dreconcile.spark.level={level}"
    )
    return conf


# Set on every session of a Spark Connect server (runtime SQL confs; the server's own conf holds
# the rest of SINK_CONF: see reconcile.connect_server).
SESSION_CONF = {k: SINK_CONF[k] for k in ("spark.sql.parquet.outputTimestampType", "spark.sql.session.timeZone")}


def is_remote(spark) -> bool:
    """Is ``spark`` a Spark Connect session (no py4j gateway in this process)?"""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _tune_local(spark) -> None:
    if is_remote(spark) or not spark.sparkContext.master.startswith("local"):
        return
    given = spark.sparkContext.getConf()
    for k, v in LOCAL_SQL_CONF.items():
        if not given.contains(k):
            spark.conf.set(k, v)


def remote_session(url: str, extra: dict[str, str] | None = None):
    """A session of the Spark Connect server at ``url`` (``sc://host:port``). pyspark's
    functions are classic or Connect per process: a process holding a classic session cannot
    open one (pyspark says so), nor the other way round."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).getOrCreate()
    for k, v in {**SESSION_CONF, **settings.spark_store_conf(), **(extra or {})}.items():
        spark.conf.set(k, v)
    return spark


def _store_conf(spark) -> None:
    """The object store's Hadoop conf (endpoint, region; never a secret) on a session that was
    created before it was known: Spark copies a session's conf into the Hadoop conf of its reads
    and writes."""
    for k, v in settings.spark_store_conf().items():
        if spark.conf.get(k, None) != v:
            spark.conf.set(k, v)


def get_session(app_name: str = "reconcile", extra: dict[str, str] | None = None, remote: str | None = None):
    """The active session, else a new one. With ``remote`` (or ``RECONCILE_SPARK_REMOTE``): a
    Spark Connect client session. Under spark-submit (which starts the Python driver with
    PYSPARK_GATEWAY_PORT set) master and jars come from the submit command line; otherwise the
    embedded default's local settings apply."""
    from pyspark.sql import SparkSession

    remote = remote or settings.spark_remote()
    if remote and "PYSPARK_GATEWAY_PORT" not in os.environ:
        return remote_session(remote, extra)
    active = SparkSession.getActiveSession()
    if active is not None:
        _store_conf(active)
        return active
    builder = SparkSession.builder.appName(app_name)
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        builder = builder.master(settings.spark_master())
        jars = settings.spark_jars()
        if jars:
            builder = builder.config("spark.jars", ",".join(jars))
        else:
            builder = builder.config("spark.jars.packages", settings.DELTA_PACKAGES)
        for k, v in local_conf().items():
            builder = builder.config(k, v)
    store = {f"spark.hadoop.{k}": v for k, v in settings.spark_store_conf().items()}
    for k, v in {**SINK_CONF, **store, **settings.metastore_conf(), **(extra or {})}.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    _store_conf(spark)
    spark.sparkContext.setLogLevel("WARN")
    _tune_local(spark)
    return spark


def consumer_conf() -> dict[str, str]:
    """The session catalog of a consumer's session (:func:`consumer_session`): a metastore
    service's (``RECONCILE_METASTORE=thrift://...``: the one the writes register in), else a
    catalog of the session's own, in memory (the embedded Derby metastore serves one process at
    a time, and the writes use it)."""
    if settings.metastore().startswith("thrift://"):
        return settings.metastore_conf()
    return {
        "spark.sql.catalogImplementation": "in-memory",
        "spark.sql.warehouse.dir": str(settings.home() / "spark-warehouse"),
    }


def consumer_session(app_name: str = "reconcile-sql", extra: dict[str, str] | None = None):
    """A Spark session that reads every sink's tables by name: ``<database>.<sink>`` (the current
    state) and ``<database>.<sink>_log`` (the shard), for the sinks in ``RECONCILE_SINKS_DIR``
    that keep a current table. With a metastore service (``thrift://``) the names are the ones
    the writes registered there; with the embedded default (or ``none``) the session has a
    catalog of its own, in memory, where they are registered by location as it starts (a name
    and a path: current by itself), so any number of consumer sessions run at once, beside the
    sink's writes. On a Spark Connect server (``RECONCILE_SPARK_REMOTE``) they are registered in
    the server's catalog. The active session of this process, if any, is used as it is."""
    from reconcile.config_loading import load_dir
    from reconcile.sink.catalog import register_for_reading

    spark = get_session(app_name, extra={**consumer_conf(), **(extra or {})})
    if not settings.metastore().startswith("thrift://"):
        register_for_reading(spark, load_dir()[0])
    return spark
