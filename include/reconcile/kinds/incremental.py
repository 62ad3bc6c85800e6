"""A query batch from its Delta sources' change feeds: the correction without the full comparison.

A query of projections, filters and ``UNION ALL`` over its sources is linear: ``Q(S + dS) = Q(S) +
Q(dS)`` for a multiset change ``dS``. When the shard holds exactly ``Q`` of the sources at the
versions the previous batch read (that batch committed, and nothing but the sink's own commits
touched the shard since: the condition under which its checksums are carried) and every source
is a Delta table whose change data feed covers the versions since, the correction is::

    consolidate( Q(inserts and update postimages since) * +1  +  Q(deletes and update preimages since) * -1 )

stamped at ``upper - 1``, computed from the changes alone: the sources are not scanned and the
shard is not read. Anything else (a query that aggregates, joins, deduplicates or reads the clock
or a random number; a source that is not Delta, whose feed is off or does not reach back, or
whose version went back; the first batch; drift) takes the full comparison, with the reason on
the batch's log. A local source whose commits since only appended rows needs no feed: the files
they added are the change. The full comparison stays the proof: every batch of
``tests/test_incremental.py`` equals the model computed from the sources in Python.
"""

from __future__ import annotations

import logging

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from reconcile.config import QuerySink
from reconcile.differential import plan_nodes
from reconcile.errors import brief
from reconcile.kinds.decode import delta_version

log = logging.getLogger(__name__)

# The analyzed plan's nodes a linear query may hold; and the functions that make a query's
# result change without its sources changing (Spark calls the clock's deterministic).
LINEAR_NODES = {"Project", "Filter", "Union", "SubqueryAlias", "View", "LogicalRelation", "LocalRelation"}
CLOCK = ("current_date", "current_timestamp", "current_time", "localtimestamp", "now(", "current_timezone")
CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
ADDED = ("insert", "update_postimage")


class NotIncremental(Exception):
    """Why this batch takes the full comparison (said on the batch's log)."""


def require_linear(df: DataFrame) -> None:
    """Raise :class:`NotIncremental` unless the query is projections, filters and ``UNION ALL``
    of its sources, deterministic and without the clock."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        raise NotIncremental("over Spark Connect the query's plan is not inspected here")
    plan = jdf.queryExecution().analyzed()
    other = sorted(plan_nodes(plan) - LINEAR_NODES)
    if other:
        raise NotIncremental(f"the query is not only projections, filters and UNION ALL ({', '.join(other)})")
    text = plan.toString().lower()
    if not plan.deterministic() or any(c in text for c in CLOCK):
        raise NotIncremental("the query is not deterministic (a random number, the clock)")


def changes(
    spark: SparkSession, cfg: QuerySink, previous: dict[str, int], versions: dict[str, int]
) -> tuple[dict[str, DataFrame], dict[str, DataFrame]]:
    """Per source, its rows added and removed since the version the previous batch read (the
    change data feed, versions ``previous + 1`` to the latest, recorded in ``versions``)."""
    added: dict[str, DataFrame] = {}
    removed: dict[str, DataFrame] = {}
    for src in cfg.sources:
        field = f"query.sources.{src.name}"
        if src.format != "delta" or src.name not in previous:
            raise NotIncremental(f"source {src.name} is not a Delta table read by the previous batch")
        if {"versionAsOf", "timestampAsOf"} & set(dict(src.options)):
            raise NotIncremental(f"source {src.name} is read at a fixed version")
        now, before = delta_version(spark, cfg, src, field), previous[src.name]
        versions[src.name] = now
        if now < before:
            raise NotIncremental(f"source {src.name} went back from version {before} to {now} (a restore)")
        rows = spark.read.format("delta").options(**dict(src.options)).load(src.path).where(F.lit(False))
        if now == before:
            added[src.name] = removed[src.name] = rows
            continue
        appended = appended_files(src.path, before, now)
        if appended is not None:  # only appends since: the added files are the change
            added[src.name] = spark.read.schema(rows.schema).parquet(*appended) if appended else rows
            removed[src.name] = rows
            continue
        try:
            feed = (
                spark.read.format("delta")
                .options(**dict(src.options))
                .option("readChangeFeed", "true")
                .option("startingVersion", before + 1)
                .option("endingVersion", now)
                .load(src.path)
            )
            feed.limit(1).collect()  # a feed not recorded for some version fails here, not mid-write
        except Exception as exc:
            raise NotIncremental(
                f"source {src.name} changed other than by appends and its change data feed is not readable: "
                f"{brief(exc, 200)}"
            ) from None
        kind = F.col("_change_type")
        keep = [c for c in feed.columns if c not in CDF_COLUMNS]
        added[src.name] = feed.where(kind.isin(*ADDED)).select(*keep)
        removed[src.name] = feed.where(~kind.isin(*ADDED)).select(*keep)
    return added, removed


# The actions of a commit that only appends rows (``add`` with dataChange); any other action that
# changes data or the table's shape (``remove``, ``metaData``, ``protocol``, ``cdc``, a deletion
# vector) makes the commit not an append.
APPEND_ONLY_ACTIONS = {"add", "commitInfo", "txn", "domainMetadata"}


def appended_files(path: str, before: int, now: int) -> list[str] | None:
    """The data files commits ``before + 1`` to ``now`` of the local Delta table at ``path`` added,
    when those commits only appended rows to an unpartitioned table (their JSON files read here:
    no Spark job); else None (a remote store, a partitioned table, a commit that removed, rewrote
    or restructured anything, a log already cleaned up)."""
    import json
    import os
    from urllib.parse import unquote

    root = path.removeprefix("file:")
    if "://" in root:
        return None
    files: list[str] = []
    for v in range(before + 1, now + 1):
        try:
            with open(os.path.join(root, "_delta_log", f"{v:020d}.json"), encoding="utf-8") as fh:
                actions = [json.loads(line) for line in fh if line.strip()]
        except (OSError, ValueError):
            return None
        for action in actions:
            (kind,) = action.keys() if len(action) == 1 else (None,)
            if kind not in APPEND_ONLY_ACTIONS:
                return None
            if kind == "add":
                add = action["add"]
                if not add.get("dataChange", True) or add.get("deletionVector") or add.get("partitionValues"):
                    return None
                rel = unquote(add["path"])
                if "://" in rel:
                    return None
                files.append(os.path.join(root, rel))
    return files


def run_on(spark: SparkSession, cfg: QuerySink, views: dict[str, DataFrame]) -> DataFrame:
    """The query run with each source's name bound to ``views``."""
    for name, df in views.items():
        df.createOrReplaceTempView(name)
    try:
        df = spark.sql(cfg.sql)
        df.schema  # noqa: B018
    except Exception as exc:  # the full comparison says what is wrong in its own words
        raise NotIncremental(f"query.sql does not run over the changes: {brief(exc, 200)}") from None
    return df
