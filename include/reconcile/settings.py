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


OBJECT_STORE_SCHEMES = ("s3://", "s3a://")


def on_object_store(path: str) -> bool:
    """Is ``path`` on S3 (``s3://bucket/prefix``; ``s3a://`` is the same to Spark)?"""
    return path.startswith(OBJECT_STORE_SCHEMES)


def s3_endpoint() -> str | None:
    """An S3-compatible endpoint other than AWS's (``AWS_ENDPOINT_URL``), None on AWS."""
    return os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3") or None


def s3_region() -> str | None:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


def delta_storage_options() -> dict[str, str]:
    """What delta-rs needs beyond the standard AWS environment variables it reads itself (the
    credentials stay in the environment: never in an option, a log line or the ledger)."""
    endpoint = s3_endpoint()
    return {"AWS_ALLOW_HTTP": "true"} if endpoint and endpoint.startswith("http://") else {}


def spark_store_conf() -> dict[str, str]:
    """Hadoop conf for S3A (set as ``spark.hadoop.<key>`` on a new session, as ``<key>`` at runtime):
    ``s3://`` through S3A, the endpoint and region off AWS. No secret: S3A takes the credentials
    from the standard AWS environment variables (or the machine's role)."""
    conf = {"fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem"}
    endpoint = s3_endpoint()
    if endpoint:
        conf["fs.s3a.endpoint"] = endpoint
        conf["fs.s3a.path.style.access"] = "true"
        conf["fs.s3a.connection.ssl.enabled"] = str(endpoint.startswith("https://")).lower()
    region = s3_region()
    if region:
        conf["fs.s3a.endpoint.region"] = region
    return conf


def commit_lease_seconds() -> float:
    """How long a writer's commit lease on a shard lasts past its last fence
    (``RECONCILE_COMMIT_LEASE_SECONDS``, default 30): the longest stall tolerated between the
    fence and the put of a commit file, and the longest a crashed writer blocks the next commit."""
    raw = os.environ.get("RECONCILE_COMMIT_LEASE_SECONDS", "30")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        from reconcile.errors import SinkError

        raise SinkError(
            f"RECONCILE_COMMIT_LEASE_SECONDS={raw!r} is not a positive number of seconds",
            remedy="set it to one (or unset it: 30 s); nothing was committed.",
        )
    return seconds


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
