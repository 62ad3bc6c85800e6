"""Update frames as pure DataFrame transforms (no I/O here): consolidate, as_of, difference.

An *update frame* has the sink's columns plus ``_error`` (null for ok rows, a message for error
rows), ``_time`` (BIGINT ms) and ``_diff`` (BIGINT). The collection as of ``t`` is, per row,
the sum of the diffs of its updates with ``_time <= t``. Each kind (``reconcile.kinds``) says
which updates of desired and persist meet, and at which times; :func:`difference` does the rest.

Both sides carry the same hash partition ``_part = pmod(xxhash64(row, _error), P)``, so updates
that cancel meet in one partition and each partition's correction is computed independently. An
upsert sink's partitions hash its key instead (:func:`partitioned_by`): every update of a key
lands in one partition, so its files hold narrow key ranges and a key's history is found there.
"""

from __future__ import annotations

import logging
import os
from contextlib import nullcontext
from time import perf_counter

from pyspark.sql import Column as SCol
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F

from reconcile.config import SinkConfig
from reconcile.model import ROW_KEYS
from reconcile.sql_names import spark_name

log = logging.getLogger(__name__)
META = ("_error", "_time", "_diff")
# The row hash ``xxhash64(row, _error)`` a correction computed with self-checks carries
# (:mod:`reconcile.checksums`); never stored.
HASH_COLUMN = "_ck_h"


def row_columns(cfg: SinkConfig) -> list[str]:
    return cfg.column_names + ["_error"]


KEY = "key"  # an upsert sink's partitions hash its key columns (Manifest.partitioned_by)


def partitioned_by(cfg: SinkConfig) -> str | None:
    """What a batch of this sink writes its hash partitions by: ``"key"`` for an upsert sink
    (every update of a key in one partition), None for every row's columns (the other kinds,
    and the upsert batches of releases before the key layout, whose manifests say nothing)."""
    return KEY if cfg.partition_key else None


def key_order(cfg: SinkConfig) -> list[str]:
    """The columns a sink's files are sorted by within each hash partition (an upsert sink's
    key: narrow key ranges per file), or none."""
    return list(cfg.partition_key)


def partition_of(cfg: SinkConfig, partitions: int | SCol | None = None, by: str | None = "sink") -> SCol:
    """The hash partition of each row: ``pmod(xxhash64(row, _error), P)``, or of its key
    (``by="key"``); P defaults to the sink's ``partitions`` (a column when rows of batches with
    different P are mixed); ``by`` defaults to what the sink's batches write (:func:`partitioned_by`)."""
    p = partitions if isinstance(partitions, SCol) else F.lit(partitions or cfg.partitions)
    by = partitioned_by(cfg) if by == "sink" else by
    columns = list(cfg.partition_key) if by == KEY else row_columns(cfg)
    return F.pmod(F.xxhash64(*[F.col(spark_name(c)) for c in columns]), p).cast("int")


def consolidate(cfg: SinkConfig, updates: DataFrame, *, partitioned: bool = True) -> DataFrame:
    """Sum diffs per (row, _error, _time[, _part]); drop zero sums. A ``HASH_COLUMN`` and the row
    key (:data:`~reconcile.model.ROW_KEYS`) the updates carry are kept: functions of the row."""
    keys = row_columns(cfg) + ["_time"] + (["_part"] if partitioned else [])
    keys += [k for k in (HASH_COLUMN, *ROW_KEYS) if k in updates.columns]
    return (
        updates.groupBy(*[F.col(spark_name(k)) for k in keys])
        .agg(F.sum("_diff").cast("bigint").alias("_diff"))
        .where(F.col("_diff") != 0)
    )


def as_of(cfg: SinkConfig, updates: DataFrame, t: int) -> DataFrame:
    """The consolidated collection as of time ``t``: one row per distinct row, ``_diff`` = count."""
    cols = row_columns(cfg)
    return (
        updates.where(F.col("_time") <= t)
        .groupBy(*[F.col(spark_name(c)) for c in cols])
        .agg(F.sum("_diff").cast("bigint").alias("_diff"))
        .where(F.col("_diff") != 0)
    )


def difference(
    cfg: SinkConfig,
    desired: DataFrame,
    persist: DataFrame,
    time: SCol,
    checks=None,
    *,
    consolidated: bool = True,
    small: bool = False,
    one_task: bool = False,
) -> DataFrame:
    """``consolidate(desired - persist)`` with both sides stamped at ``time`` (a column of each
    side's ``_time``), hash-partitioned: the correction's last step, for any kind.

    ``checks`` (:class:`reconcile.checksums.BatchChecks`): observe the checksums of desired, and of
    persist unless they are carried, on each side as it enters the union; the correction then
    carries the row hash in ``HASH_COLUMN`` (the staged write's observation sums it).

    ``consolidated`` False (a shard that holds nothing yet, and a desired side whose updates are
    each +1): the updates as they come, identical rows as separate updates, no shuffle; the same
    collection at every time, consolidated later by compaction. The desired side's checksums are
    then the staged correction's plus the shard's (not observed twice over the same rows: an
    initial load's write hashes each row for its checks once).

    The correction carries each row's key (:data:`~reconcile.model.ROW_KEYS`): stored where a
    side carries it (persist read by :func:`reconcile.storage.frames.read_keyed`), else hashed.

    ``small`` (a correction from the sources' changes, likely small): the shuffle into partitions
    takes as many tasks as adaptive execution finds worth it (one for a few thousand rows, each
    writing its rows' partitions), not one task a partition; ``one_task`` (a correction known to be
    small): no shuffle, one task consolidates and writes it."""
    cols = row_columns(cfg)
    keep = [F.col(spark_name(c)) for c in cols]
    k1, k2 = (F.col(k) for k in ROW_KEYS)
    part = F.pmod(k1, F.lit(cfg.partitions)).cast("int")

    def side(df: DataFrame, diff: SCol) -> DataFrame:
        hashed = checks is not None
        return with_row_key(cfg, df).select(
            *keep,
            time.alias("_time"),
            diff.cast("bigint").alias("_diff"),
            k1,
            k2,
            *([k1.alias(HASH_COLUMN)] if hashed else []),
            part.alias("_part"),
        )

    if checks is None:
        both = side(desired, F.col("_diff")).unionByName(side(persist, -F.col("_diff")))
    else:
        d = side(desired, F.col("_diff"))
        if consolidated:
            d = checks.observe_hashed(d, "desired", {"desired": 1})
        else:  # the correction is staged as it comes: desired = correction + persist, by construction
            checks.count_correction_into("desired")
        persisted = {"shard": -1} if consolidated else {"shard": -1, "desired": -1}
        p = side(persist, -F.col("_diff"))
        if checks.carried is None:
            p = checks.observe_hashed(p, "persist", persisted)  # negated on this side
        else:
            checks.carry({side_: -n for side_, n in persisted.items()})
        both = d.unionByName(p)
    if not consolidated:
        return both
    # Shuffle once by partition; the aggregation below reuses that distribution.
    if one_task:
        by_part = both.coalesce(1)  # one partition: the aggregation below needs no exchange
    else:
        by_part = both.repartition("_part") if small else both.repartition(cfg.partitions, "_part")
    return consolidate(cfg, by_part)


# Hash-first: the second, independent 64 bits of a row's 128-bit key (the first are the row hash
# itself, seed 42), and how many bits of each half the key keeps: 64, unless a test narrows it to
# force collisions (the batch's checksums, over the full row hash, then catch what a collision
# hid, and the batch is computed again by the full comparison).
KEY_SALT = 0x7265636F6E63696C
KEY_BITS_ENV = "RECONCILE_TEST_HASH_KEY_BITS"
BROADCAST_KEYS = 2_000_000  # changed keys up to this count are broadcast to the second pass
CACHE_ENV = "RECONCILE_HASH_FIRST_CACHE"  # 1 / 0: cache the desired side always / never (:func:`worth_caching`)


def label_jobs(spark, text: str | None) -> None:
    """Name the Spark jobs this thread starts from now on (the stage profile and Spark's UI show
    it; ``bench/profile_query.py``); None clears it. Nothing over Spark Connect."""
    if spark is not None and not type(spark).__module__.startswith("pyspark.sql.connect"):
        spark.sparkContext.setJobDescription(text)


def row_key(cfg: SinkConfig) -> tuple[SCol, SCol]:
    """A row's 128-bit key computed from the row: its row hash ``xxhash64(row, _error)`` (seed
    42: the checksum's and the partition's) and a salted second hash of the same columns."""
    keep = [F.col(spark_name(c)) for c in row_columns(cfg)]
    return F.xxhash64(*keep), F.xxhash64(F.lit(KEY_SALT), *keep)


def with_row_key(cfg: SinkConfig, df: DataFrame) -> DataFrame:
    """``df`` with the row key columns: as it carries them (a shard's rows as read, their stored
    key already checked or hashed), else computed from the row."""
    if all(k in df.columns for k in ROW_KEYS):
        return df
    k1, k2 = row_key(cfg)
    return df.withColumns({ROW_KEYS[0]: k1, ROW_KEYS[1]: k2})


def _key(h: SCol) -> SCol:
    bits = int(os.environ.get(KEY_BITS_ENV) or 64)
    return h if bits >= 64 else h.bitwiseAND(F.lit((1 << bits) - 1))


def hash_first(
    cfg: SinkConfig, desired: DataFrame, persist: DataFrame, time: SCol, checks=None, *, spark=None
) -> DataFrame:
    """:func:`difference` for a correction whose updates all get one ``time`` (a query's), in two
    passes that shuffle full rows only where the collection changed:

    1. both sides as ``(128-bit row key, diff)`` (:func:`row_key`: the desired side's hashed once,
       persist's as stored, :func:`reconcile.storage.frames.read_keyed`, so that persist is read
       narrow: its key columns, ``_time`` and ``_diff``); summed per key; the keys whose sum is not
       0 are the changed rows (a job of its own: 24 bytes a row shuffled, not the row);
    2. the rows of those keys on both sides (a broadcast semi-join up to :data:`BROADCAST_KEYS`
       keys), consolidated as :func:`difference` does.

    A desired side whose plan shuffles (a join, an aggregate: :func:`worth_caching`) is evaluated
    once: its rows with their key are cached by pass 1 (memory, spilling to local disk) and pass 2
    reads the changed ones from there; the cache is released when the correction's write is done
    (:func:`release`). A scan of files is read and hashed again by pass 2: cheaper than caching it. ``checks`` observes both sides'
    checksums in pass 1, over the full row hash: a key collision (2^-128 per pair of rows) makes
    the batch not add up, and the write computes it again with :func:`difference`."""
    from pyspark import StorageLevel

    cols = row_columns(cfg)
    keep = [F.col(spark_name(c)) for c in cols]
    k1, k2 = (F.col(k) for k in ROW_KEYS)
    part = F.pmod(k1, F.lit(cfg.partitions)).cast("int")
    wanted = with_row_key(cfg, desired).select(*keep, F.col("_diff"), k1, k2)
    cached = wanted
    if worth_caching(desired):
        cached = wanted.persist(StorageLevel.MEMORY_AND_DISK)
        _CACHED.append(cached)

    def narrow(df: DataFrame, diff: SCol) -> DataFrame:
        return df.select(
            k1.alias(HASH_COLUMN),
            part.alias("_part"),
            _key(k1).alias("_k1"),
            _key(k2).alias("_k2"),
            diff.cast("bigint").alias("_diff"),
        )

    stored = with_row_key(cfg, persist)
    d, p = narrow(cached, F.col("_diff")), narrow(stored, -F.col("_diff"))
    if checks is not None:
        d = checks.observe_hashed(d, "desired", {"desired": 1})
        if checks.carried is None:
            p = checks.observe_hashed(p, "persist", {"shard": -1})  # negated on this side
        else:
            checks.carry({"shard": 1})
    changed = (
        d.unionByName(p)
        .groupBy("_k1", "_k2")
        .agg(F.sum("_diff").alias("_n"))
        .where(F.col("_n") != 0)
        .select("_k1", "_k2")
        .cache()
    )
    _CACHED.append(changed)
    session = spark or desired.sparkSession
    started = perf_counter()
    label_jobs(session, "reconcile: hash-first pass 1 (row keys of desired and persist)")
    with checks.observing(session) if checks is not None else nullcontext():
        n = changed.count()
    label_jobs(session, "reconcile: hash-first pass 2 (rows of the changed keys) and the staged write")
    log.info("hash-first pass 1: %d changed row key(s) in %.2f s", n, perf_counter() - started)
    keys = F.broadcast(changed) if n <= BROADCAST_KEYS else changed

    def full(df: DataFrame, diff: SCol) -> DataFrame:
        rows = df.select(
            *keep,
            time.alias("_time"),
            diff.cast("bigint").alias("_diff"),
            k1,
            k2,
            k1.alias(HASH_COLUMN),
            part.alias("_part"),
            _key(k1).alias("_k1"),
            _key(k2).alias("_k2"),
        )
        return rows.join(keys, ["_k1", "_k2"], "left_semi").drop("_k1", "_k2")

    both = full(cached, F.col("_diff")).unionByName(full(stored, -F.col("_diff")))
    out = consolidate(cfg, both.repartition(cfg.partitions, "_part"))
    return out if checks is not None else out.drop(HASH_COLUMN)  # carried only for the staged write's checksums


# What makes a desired side worth caching between the passes rather than evaluating it twice: a
# shuffle of its own (a join, an aggregate, a window, a sort, a distinct). A scan of files, with
# projections and filters, is read again: at 10M rows / 0.1% (bench/alternatives.py, alone) the
# cached batch took 52.2 s, evaluating the scan twice 29.4 s (building the cache of every row
# costs more than a second scan and hash).
COSTLY_PLAN_NODES = ("Join", "Aggregate", "Window", "Sort", "Distinct", "Generate", "Expand", "Repartition")


def worth_caching(desired: DataFrame) -> bool:
    """Whether :func:`hash_first` caches the desired side (``RECONCILE_HASH_FIRST_CACHE``: 1
    always, 0 never; else when its optimized plan shuffles, :data:`COSTLY_PLAN_NODES`; over Spark
    Connect, whose plan this process cannot see, never)."""
    forced = os.environ.get(CACHE_ENV)
    if forced in ("0", "1"):
        return forced == "1"
    jdf = getattr(desired, "_jdf", None)
    if jdf is None:  # Spark Connect
        return False
    names = plan_nodes(jdf.queryExecution().optimizedPlan())
    return any(any(n.startswith(c) or n.endswith(c) for c in COSTLY_PLAN_NODES) for n in names)


def plan_nodes(plan) -> set[str]:
    """The names of the nodes of a JVM query plan (a classic session's, through py4j)."""
    names: set[str] = set()
    stack = [plan]
    while stack:
        node = stack.pop()
        names.add(node.nodeName())
        children = node.children()
        stack += [children.apply(i) for i in range(children.size())]
    return names


# The frames :func:`hash_first` cached, released by :func:`release` once the write is done.
_CACHED: list[DataFrame] = []


def cached(df: DataFrame) -> DataFrame:
    """``df`` cached (memory, spilling to local disk) until :func:`release`."""
    out = df.cache()
    _CACHED.append(out)
    return out


def release() -> None:
    """Release what the last corrections cached (their write is done, or failed)."""
    while _CACHED:
        _CACHED.pop().unpersist()


def one_row(df: DataFrame) -> Row:
    """The single row of an aggregation without groups."""
    row = df.first()
    assert row is not None, "an aggregation without groups returns one row"
    return row
