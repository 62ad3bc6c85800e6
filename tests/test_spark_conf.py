"""Production spark-submits carry what the sink needs, not settings tuned for one machine."""

from __future__ import annotations

from reconcile.spark import LOCAL_CONF, LOCAL_SQL_CONF, SINK_CONF, submit_conf


def test_submit_conf_carries_the_sink_needs_and_no_local_tuning():
    conf = submit_conf()
    assert {k: conf[k] for k in SINK_CONF} == SINK_CONF
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert not set(conf) & (set(LOCAL_CONF) | set(LOCAL_SQL_CONF)), set(conf) & (set(LOCAL_CONF) | set(LOCAL_SQL_CONF))
    assert "spark.jars" in conf or "spark.jars.packages" in conf


def test_a_local_session_is_tuned_only_where_it_was_not_told_otherwise(spark):
    # the test session sets its own shuffle partitions (2): kept; the sink's settings are on
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.databricks.delta.commitInfo.enabled") == "true"
