"""Production spark-submits carry what the sink needs, not settings tuned for one machine; a local
session is tuned for its machine only where it was not told otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from reconcile.spark import LOCAL_CONF, LOCAL_SQL_CONF, SINK_CONF, submit_conf


def test_submit_conf_carries_the_sink_needs_and_no_local_tuning():
    conf = submit_conf()
    assert {k: conf[k] for k in SINK_CONF} == SINK_CONF
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert not set(conf) & (set(LOCAL_CONF) | set(LOCAL_SQL_CONF)), set(conf) & (set(LOCAL_CONF) | set(LOCAL_SQL_CONF))
    assert "spark.jars" in conf or "spark.jars.packages" in conf


def test_a_local_session_keeps_what_it_was_told_and_has_the_sink_settings(spark):
    # the test session sets its own shuffle partitions (2): kept; the sink's settings are on
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.databricks.delta.commitInfo.enabled") == "true"


def test_a_new_local_session_is_tuned_where_it_was_not_told():
    """A session started from nothing (in a process of its own: one JVM per process) told its
    shuffle partitions keeps them and gets the machine's value of what it was not told."""
    told = {"spark.sql.shuffle.partitions": "3"}
    script = (
        "import json, sys\n"
        "from reconcile.spark import get_session\n"
        "spark = get_session('tuning', json.loads(sys.argv[1]))\n"
        "print(json.dumps({k: spark.conf.get(k, None) for k in json.loads(sys.argv[2])}))\n"
        "spark.stop()\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_GATEWAY_PORT", "RECONCILE_SPARK_REMOTE")}
    argv = [sys.executable, "-c", script, json.dumps(told), json.dumps(sorted(LOCAL_SQL_CONF))]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert set(told) < set(LOCAL_SQL_CONF)  # one setting told, at least one left to tune
    assert json.loads(r.stdout.splitlines()[-1]) == {**LOCAL_SQL_CONF, **told}
