"""Environment-driven settings. Read lazily (never at import time of a DAG file)."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def home() -> Path:
    """Root of the embedded default's state (metadata DB, warehouse)."""
    return Path(os.environ.get("RECONCILE_HOME", PROJECT_ROOT / ".reconcile"))


def metadata_url() -> str:
    url = os.environ.get("RECONCILE_METADATA_URL")
    if url:
        return url
    path = home() / "metadata.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def warehouse() -> str:
    """Root under which each sink's Delta table and staged batches live (a path or URI)."""
    root = os.environ.get("RECONCILE_WAREHOUSE")
    if root:
        return root.rstrip("/")
    path = home() / "warehouse"
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def sinks_dir() -> Path:
    return Path(os.environ.get("RECONCILE_SINKS_DIR", PROJECT_ROOT / "include" / "sinks"))


def spark_master() -> str:
    return os.environ.get("RECONCILE_SPARK_MASTER", "local[*]")


def spark_remote() -> str | None:
    """A Spark Connect server's URL (``sc://host:port``): Spark jobs run as its clients, in this
    process, instead of starting a JVM of their own (None: classic Spark)."""
    return os.environ.get("RECONCILE_SPARK_REMOTE") or None


def spark_jars() -> list[str]:
    """Delta's JVM artifacts as local jar paths (fetched by scripts/fetch_jars.sh)."""
    env = os.environ.get("RECONCILE_SPARK_JARS")
    if env:
        return [j for j in env.split(",") if j]
    jar_dir = PROJECT_ROOT / ".jars"
    return sorted(str(p) for p in jar_dir.glob("*.jar")) if jar_dir.is_dir() else []


DELTA_PACKAGES = "io.delta:delta-spark_2.13:4.4.0"


# Airflow's own metadata database on SQLite (the embedded default, scripts/env.sh): the
# scheduler, the dag-processor and a CLI command write at once, and sqlite3's 5 s wait for a
# lock is too short on a busy 2-core machine ("database is locked"). Named by
# AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS; never used with PostgreSQL.
AIRFLOW_SQLITE_CONNECT_ARGS = {"timeout": 60}
