"""The sink's tables found by name: a sink that keeps a current-state table (``current:``) has
both its tables registered in the Spark session catalog, when that catalog is a Hive metastore
(``RECONCILE_METASTORE``: the embedded Derby default, a metastore service or database):

- ``<database>.<sink>``: the current-state table, a plain table of the sink's columns;
- ``<database>.<sink>_log``: the shard, the update log (``_time``, ``_diff``, ``_error``).

Both are external Delta tables registered by location: the metastore holds a name and a path,
Delta's log holds everything else (schema included), so a registration stays current by itself.
The write stage registers them (the current table is created empty first, the append fills
it); a registration already made under the same metastore, names and paths is remembered in
``RECONCILE_HOME/catalog/<sink>.json`` and not made again (the embedded Derby metastore is
booted only then). A registration that fails (the embedded metastore busy in another Spark
process: Derby serves one at a time) is logged and tried again by the first write
:data:`RETRY_AFTER_S` later: it never fails a batch, and costs a write at most one quick failed
attempt (the embedded metastore's own retries are off, :func:`reconcile.settings.metastore_conf`).
"""

from __future__ import annotations

import json
import logging
import time

from reconcile import settings
from reconcile.config import SinkConfig
from reconcile.errors import brief
from reconcile.log import event
from reconcile.sink.current import catalog_names
from reconcile.sql_names import spark_dotted, spark_name
from reconcile.storage import files
from reconcile.storage.current import CurrentTable
from reconcile.storage.delta import ShardTable

log = logging.getLogger(__name__)
RETRY_AFTER_S = 600


def _spark_path(path: str) -> str:
    """A table location as Spark's Hadoop file systems name it."""
    return path if "://" in path else f"file:{path}"


def wanted(cfg: SinkConfig) -> dict:
    """What the catalog must hold for the sink: the metastore, and each name with its path."""
    current, shard = catalog_names(cfg)
    return {
        "metastore": settings.metastore(),
        "tables": {current: CurrentTable(cfg).path, shard: ShardTable(cfg).path},
    }


def _marker(cfg: SinkConfig):
    return settings.home() / "catalog" / f"{cfg.name}.json"


def _failed(cfg: SinkConfig):
    return settings.home() / "catalog" / f"{cfg.name}.failed"


def _failed_recently(cfg: SinkConfig) -> bool:
    try:
        return time.time() - _failed(cfg).stat().st_mtime < RETRY_AFTER_S
    except OSError:
        return False


def registered(cfg: SinkConfig) -> bool:
    """Was the sink registered under today's metastore, names and paths (by this machine)?"""
    try:
        return json.loads(_marker(cfg).read_text()) == wanted(cfg)
    except (OSError, ValueError):
        return False


def hive_backed(spark) -> bool:
    try:
        return spark.conf.get("spark.sql.catalogImplementation", "in-memory") == "hive"
    except Exception:  # noqa: BLE001 - a Connect server that does not say
        return False


def _location(spark, name: str) -> str:
    """Where a registered table points; "" when its location is no Delta table any more (a
    sink's earlier path, deleted): re-registered like one pointing elsewhere."""
    try:
        return str(spark.sql(f"DESCRIBE DETAIL {spark_dotted(name)}").collect()[0]["location"])
    except Exception:  # noqa: BLE001 - Delta's DELTA_PATH_DOES_NOT_EXIST and its kin
        return ""


def register(spark, cfg: SinkConfig, *, force: bool = False) -> str | None:
    """Register the sink's two tables (see the module doc); returns what was done, or None when
    there is nothing to do (no current table, no Hive-backed catalog, already registered)."""
    if cfg.current is None or not hive_backed(spark) or (registered(cfg) and not force):
        return None
    if _failed_recently(cfg) and not force:
        return None
    want = wanted(cfg)
    try:
        if not CurrentTable(cfg).exists():
            CurrentTable(cfg).create()
        db = cfg.current.database
        spark.sql(f"CREATE DATABASE IF NOT EXISTS {spark_name(db)}")
        for name, path in want["tables"].items():
            if spark.catalog.tableExists(name):
                if _location(spark, name).rstrip("/") in (path.rstrip("/"), _spark_path(path).rstrip("/")):
                    continue
                spark.sql(f"DROP TABLE {spark_dotted(name)}")  # external: the files stay
            location = _spark_path(path).replace("'", "\\'")
            spark.sql(f"CREATE TABLE IF NOT EXISTS {spark_dotted(name)} USING DELTA LOCATION '{location}'")
    except Exception as exc:  # noqa: BLE001 - the catalog is a convenience: the batch goes on
        event(
            log,
            f"could not register {', '.join(want['tables'])} in the catalog ({settings.metastore()}): "
            f"{brief(exc, 300)}; a write in {RETRY_AFTER_S // 60} minutes or later tries again",
            level=logging.WARNING,
            sink=cfg.name,
        )
        _failed(cfg).parent.mkdir(parents=True, exist_ok=True)
        _failed(cfg).touch()
        return None
    marker = _marker(cfg)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(want, sort_keys=True))
    _failed(cfg).unlink(missing_ok=True)
    return event(log, f"registered {', '.join(want['tables'])} in the catalog ({settings.metastore()})", sink=cfg.name)


def register_for_reading(spark, cfgs: list[SinkConfig]) -> list[str]:
    """Register the tables of each sink in ``cfgs`` that keeps a current table in ``spark``'s
    session catalog, by location (:func:`wanted`): a consumer's own catalog
    (:func:`reconcile.spark.consumer_session`), so nothing is written to a shared metastore.
    Tables not created yet are left out. Returns the names registered."""
    done: list[str] = []
    for cfg in cfgs:
        if cfg.current is None:
            continue
        spark.sql(f"CREATE DATABASE IF NOT EXISTS {spark_name(cfg.current.database)}")
        for name, path in wanted(cfg)["tables"].items():
            log = f"{path}/_delta_log"
            if not files.list_names(log):
                continue
            location = _spark_path(path).replace("'", "\\'")
            spark.sql(f"CREATE TABLE IF NOT EXISTS {spark_dotted(name)} USING DELTA LOCATION '{location}'")
            done.append(name)
    return done
