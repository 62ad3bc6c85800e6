"""Query sinks: a Spark SQL query over named sources, a snapshot refreshed at ``upper - 1``.

Its value is known only when the run evaluates it (a refresh, not a history), so::

    correction = consolidate( snapshot - persist as of (upper - 1) ),  all stamped at upper - 1

and the shard as of ``upper - 1`` equals the query's result (drift included in the repair) while
every earlier time keeps what it had.
"""

from __future__ import annotations

import logging

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from reconcile import differential_cells
from reconcile.config import QuerySink
from reconcile.differential import difference, hash_first
from reconcile.errors import SourceError, brief
from reconcile.kinds.decode import read_source, require_columns, validate
from reconcile.kinds.protocol import QUERY_SOURCE

log = logging.getLogger(__name__)
# The files of sources' changes up to this size are read, consolidated and written by one task.
ONE_TASK_BYTES = 1 * 2**20
WRITES = ("InsertIntoStatement", "OverwriteByExpression", "AppendData", "ReplaceData", "WriteDelta")


def require_query(spark: SparkSession, cfg: QuerySink) -> None:
    """Refuse query.sql that is not a plain query *before* running it: ``spark.sql`` executes
    commands (DELETE, INSERT, DROP, SET ...) at once."""
    from reconcile.spark import is_remote

    if is_remote(spark):
        require_query_remote(spark, cfg)
        return
    jvm = spark._jvm
    assert jvm is not None
    try:
        plan = spark._jsparkSession.sessionState().sqlParser().parsePlan(cfg.sql)
    except Exception as exc:
        text = brief(exc, 300)
        raise SourceError(f"query.sql does not run (it does not parse): {text}", sink=cfg.name) from None
    command = jvm.java.lang.Class.forName("org.apache.spark.sql.catalyst.plans.logical.Command")
    kind = plan.getClass().getSimpleName()
    while kind == "UnresolvedWith":  # WITH ... <statement>: look at the statement
        plan = plan.child()
        kind = plan.getClass().getSimpleName()
    if command.isInstance(plan) or kind in WRITES:
        raise SourceError(
            f"query.sql must be a query (SELECT/WITH/VALUES), not a command ({kind}); nothing was run.",
            sink=cfg.name,
        )


def require_query_remote(spark: SparkSession, cfg: QuerySink) -> None:
    """:func:`require_query` over Spark Connect, which has no parser in this process: the text is
    analysed as a subquery, which no command (and no second statement) parses as."""
    body = cfg.sql.strip().rstrip(";")
    try:
        spark.sql(f"SELECT * FROM (\n{body}\n) AS reconcile_query LIMIT 0").schema  # noqa: B018
    except Exception as exc:
        text = brief(exc, 300)
        raise SourceError(
            f"query.sql must be one query (SELECT/WITH/VALUES) that runs; nothing was run: {text}", sink=cfg.name
        ) from None


def desired(spark: SparkSession, cfg: QuerySink, versions: dict[str, int] | None = None) -> DataFrame:
    """The query's result as an update frame (``_diff`` = 1 per row, no time). ``versions``: each
    Delta source is read at one version, recorded there (:func:`~reconcile.kinds.decode.read_source`)."""
    for src in cfg.sources:
        read_source(spark, cfg, src, f"query.sources.{src.name}", versions).createOrReplaceTempView(src.name)
    require_query(spark, cfg)
    try:
        df = spark.sql(cfg.sql)
        df.schema  # noqa: B018
    except Exception as exc:
        text = brief(exc, 400)
        raise SourceError(f"query.sql does not run: {text}", sink=cfg.name) from None
    require_columns(cfg, df, cfg.column_names, QUERY_SOURCE)
    extra = sorted({c.lower() for c in df.columns} - {c.lower() for c in cfg.column_names})
    if extra:
        raise SourceError(
            f"the result of query.sql has column(s) {extra} that are not in the sink's schema",
            sink=cfg.name,
        )
    return validate(cfg, df, QUERY_SOURCE, F.lit(1), None)


def query_digest(cfg: QuerySink) -> str:
    """A digest of what a batch of the sink computes: its SQL, its sources (name, format, path,
    options) and its columns (name, type, nullable)."""
    import hashlib
    import json

    what = {
        "sql": cfg.sql,
        "sources": [[s.name, s.format, s.path, sorted(dict(s.options).items())] for s in cfg.sources],
        "columns": [[c.name, c.type, c.nullable] for c in cfg.columns],
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def incremental_correction(
    spark: SparkSession,
    cfg: QuerySink,
    previous: dict[str, int],
    upper: int,
    checks,
    versions: dict[str, int],
    persist: DataFrame | None = None,
) -> DataFrame | None:
    """The correction of the batch ending at ``upper`` from the sources' change feeds since the
    versions the previous batch read (:mod:`reconcile.kinds.incremental`; raises
    :class:`~reconcile.kinds.incremental.NotIncremental` where it does not apply): a linear query
    over the changes alone; a GROUP BY or join over the sources filtered to the keys the changes
    touch, less those keys' old rows (``persist``: the shard as read). The shard's checksums are
    carried from the previous batch; the desired side's are those plus the correction's (it is
    not scanned). None: no source has a version since the previous batch's, so the correction
    holds nothing (known without a Spark job)."""
    from reconcile.kinds import incremental
    from reconcile.spark import is_remote

    if checks is not None and checks.carried is None:
        raise incremental.NotIncremental("the shard's checksums are not carried from the previous batch")
    if is_remote(spark):
        raise incremental.NotIncremental("over Spark Connect the query's plan is not inspected here")
    require_query(spark, cfg)  # a command in query.sql is refused before anything runs
    versions.update(incremental.latest_versions(spark, cfg, previous))
    if all(versions[name] == previous[name] for name in versions):
        if checks is not None:  # the shard's as carried, and the desired side's the same
            checks.carry({"shard": 1, "desired": 1})
        return None
    probes: list = []  # a keyed query reads the feeds whole before the write: no probe of a row
    sizes: dict[str, int] = {}
    added, removed = incremental.changes(spark, cfg, previous, versions, probes, sizes)
    # a change known small is consolidated and written by one task (no shuffle), else as adaptive
    # execution splits it
    one_task = len(sizes) == len(cfg.sources) and sum(sizes.values()) <= ONE_TASK_BYTES
    plus = incremental.run_on(spark, cfg, added)
    try:
        incremental.require_linear(plus, {s.name for s in cfg.sources})
    except incremental.NotIncremental as why:
        if not why.shape:
            raise
        # a GROUP BY or a join, or it says why not
        updates, old = incremental.keyed_updates(spark, cfg, previous, versions, (added, removed), persist, upper)
    else:
        incremental.probe(probes)
        minus = incremental.run_on(spark, cfg, removed)
        sign = "_reconcile_sign"  # the query's rows over the rows added (+1) and removed (-1), validated once
        both = plus.withColumn(sign, F.lit(1)).unionByName(minus.withColumn(sign, F.lit(-1)))
        require_columns(cfg, both, cfg.column_names, QUERY_SOURCE)
        updates = validate(cfg, both, QUERY_SOURCE, F.col(sign), None)
        old = spark.createDataFrame([], updates.schema)
    stamp = F.lit(upper - 1).cast("bigint")
    out = difference(cfg, updates, old, stamp, None, small=True, one_task=one_task)
    if checks is not None:
        checks.carry({"shard": 1, "desired": 1})
        checks.count_correction_into("desired")
    return out


def correction(
    cfg: QuerySink,
    snapshot: DataFrame,
    persist: DataFrame,
    lower: int,
    upper: int,
    checks=None,
    bulk: bool = False,
    exact: bool = False,
    shard_rows: int | None = None,
) -> DataFrame:
    """The snapshot's correction for ``(lower, upper)``: update frame plus ``_part`` (``checks``:
    :func:`reconcile.differential.difference`'s). ``bulk`` (the shard holds nothing yet): the
    snapshot's rows as they come, each +1, without the shuffle that consolidates them. Otherwise
    one scan of the snapshot whose row keys are summed into cells
    (:func:`reconcile.differential_cells.correction`, for a shard of ``shard_rows`` update rows
    where :func:`~reconcile.differential_cells.wanted`; where its cells do not peel, with more
    cells, then) hash first (:func:`reconcile.differential.hash_first`: only the changed rows are
    shuffled in full), or, with ``exact``, every row of both sides compared in full."""
    assert lower < upper, f"invalid description [{lower}, {upper})"
    below = persist.where(F.col("_time") < upper)
    stamp = F.lit(upper - 1).cast("bigint")
    if bulk or exact:
        return difference(cfg, snapshot, below, stamp, checks, consolidated=not bulk)
    if differential_cells.wanted(shard_rows, snapshot) and not (checks is not None and checks.guarded):
        cells = differential_cells.cells_per_table()
        for per_table in (cells, cells * differential_cells.RETRY_FACTOR):
            try:
                return differential_cells.correction(cfg, snapshot, below, stamp, checks, per_table=per_table)
            except differential_cells.NotPeeled as exc:
                log.info(
                    "one scan: the cells did not peel (%s); computing it %s",
                    exc,
                    "again with more cells" if per_table == cells else "hash first",
                )
    return hash_first(cfg, snapshot, below, stamp, checks)


def plan(spark: SparkSession, cfg: QuerySink) -> None:
    """Analyse query.sql against its sources' schemas without running it (``validate``)."""
    try:
        desired(spark, cfg).schema  # noqa: B018 - analysis of the whole desired frame
    finally:
        for src in cfg.sources:  # a later sink must not see this one's views
            spark.catalog.dropTempView(src.name)
