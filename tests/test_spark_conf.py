"""Production spark-submits carry what the sink needs, not settings tuned for one machine; a local
session is sized for its machine (driver heap from the memory, shuffle tasks from the cores) only
where it was not told otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from reconcile.spark import (
    LOCAL_CONF,
    LOCAL_SQL_CONF,
    SINK_CONF,
    driver_memory,
    local_conf,
    machine_cores,
    machine_memory_bytes,
    shuffle_partitions,
    submit_conf,
)

GIB = 2**30


def test_submit_conf_carries_the_sink_needs_and_no_local_tuning():
    conf = submit_conf()
    assert {k: conf[k] for k in SINK_CONF} == SINK_CONF
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert not set(conf) & (set(LOCAL_CONF) | set(LOCAL_SQL_CONF)), set(conf) & (set(LOCAL_CONF) | set(LOCAL_SQL_CONF))
    assert "spark.jars" in conf or "spark.jars.packages" in conf


def test_the_sizing_rule():
    # half of what is left after 4 GiB for Airflow, Python and the OS, within 1-32 GiB
    assert driver_memory(24 * GIB) == "10240m"
    assert driver_memory(int(23.5 * GIB)) == "9984m"
    assert driver_memory(8 * GIB) == "2048m"
    assert driver_memory(4 * GIB) == driver_memory(2 * GIB) == "1024m"
    assert driver_memory(512 * GIB) == "32768m"
    # four shuffle tasks per core
    assert shuffle_partitions(2) == "8" and shuffle_partitions(16) == "64" and shuffle_partitions(0) == "4"
    # the machine's figures: positive, memory no more than /proc/meminfo says
    with open("/proc/meminfo") as f:
        total_kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    assert 0 < machine_memory_bytes() <= total_kib * 1024
    assert 1 <= machine_cores() <= (os.cpu_count() or 1)


def test_spark_driver_memory_in_the_environment_replaces_the_sized_heap():
    assert local_conf({})["spark.driver.memory"] == driver_memory(machine_memory_bytes())
    assert "spark.driver.memory" not in local_conf({"SPARK_DRIVER_MEMORY": "1g"})
    assert local_conf({})["spark.ui.enabled"] == "false"


def test_a_local_session_keeps_what_it_was_told_and_has_the_sink_settings(spark):
    # the test session sets its own shuffle partitions (2): kept; the sink's settings are on
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.databricks.delta.commitInfo.enabled") == "true"


@pytest.mark.slow  # a JVM of its own
def test_a_new_local_session_is_sized_for_the_machine_where_it_was_not_told():
    """A session started from nothing (in a process of its own: one JVM per process) keeps what it
    was told and gets the machine's sizes of the rest, read back from the running session: the
    driver's heap from its conf and from the JVM itself, the shuffle tasks from the SQL conf."""
    told = {"spark.databricks.delta.snapshotPartitions": "3"}
    script = (
        "import json, sys\n"
        "from reconcile.spark import get_session\n"
        "spark = get_session('sizing', json.loads(sys.argv[1]))\n"
        "conf = {k: spark.conf.get(k, None) for k in json.loads(sys.argv[2])}\n"
        "conf['spark.driver.memory'] = spark.sparkContext.getConf().get('spark.driver.memory')\n"
        "conf['max_heap'] = spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory()\n"
        "print(json.dumps(conf))\n"
        "spark.stop()\n"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYSPARK_GATEWAY_PORT", "RECONCILE_SPARK_REMOTE", "SPARK_DRIVER_MEMORY")
    }
    argv = [sys.executable, "-c", script, json.dumps(told), json.dumps(sorted(LOCAL_SQL_CONF))]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.splitlines()[-1])
    heap = driver_memory(machine_memory_bytes())
    assert set(told) < set(LOCAL_SQL_CONF)  # one setting told, at least one left to size
    assert {k: got[k] for k in LOCAL_SQL_CONF} == {**LOCAL_SQL_CONF, **told}
    assert got["spark.sql.shuffle.partitions"] == shuffle_partitions(machine_cores())
    assert got["spark.driver.memory"] == heap
    # the JVM's own maximum heap is the sized one (less a survivor space, rounded to GC regions)
    assert 0.85 <= got["max_heap"] / (int(heap[:-1]) * 2**20) <= 1.02, (got["max_heap"], heap)
