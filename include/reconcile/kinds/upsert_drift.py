"""Repairing foreign writes to an upsert shard (pure transforms over the feed and the shard).

An upsert batch touches only the keys its commands name, so a foreign writer's change to any
other key (a deleted key, a key the feed never had, a changed value) would outlive it. When
foreign Delta versions changed rows since a batch last repaired the shard, the write hands the
kind the keys those versions touched (:class:`~reconcile.kinds.protocol.DriftRepair`); for those
keys the batch recomputes what the shard must hold from the feed itself and writes the
difference.

**What the feed defines.** A command ``(t, o)`` was applied by the first committed batch ``j``
(in order) whose upper is above ``t`` and whose read of the feed saw it (``o <= w_j``, the
batch's recorded ``source_offset``): ``t < upper_j`` and ``o <= w_j`` both stay true once true,
since uppers and watermarks never decrease. It took effect at ``max(t, lower_j)``, which equals
``max(t, lower_1, lower of the first batch whose watermark reaches o)``. A key's value as of the
last committed batch is its command with the highest ``(effective time, offset)`` (ties: the same
order the batch's own aggregation uses), absent if that command deletes. Commands that cannot be
keyed (a null key) are error rows of their own, one per applied command.

**What it cannot define.** A touched key for which the feed holds no applied command is either a
key the feed never had (a foreign writer added it: the repair removes it) or one whose commands
the feed no longer holds (retention): if the key held a value before the foreign versions (or
that is unknown, the versions being vacuumed), it is **not repairable** from the feed and is
left as it is, reported with the remedy, and tried again by every later batch.

The repair, for the repairable touched keys ``R``, at time ``lower``: the feed's state of ``R``
minus the shard's (as read below ``upper``); the batch's own commands on a key of ``R`` then take
the feed's state as their previous value.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column as SCol
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from reconcile.config import UpsertSink
from reconcile.kinds.protocol import DriftRepair
from reconcile.sql_names import spark_name

INT = "bigint"
LONG_MIN = -(1 << 63)
SAMPLE = 20  # unrepairable keys named in the ledger and the reports
CARRY = 1000  # unrepairable keys carried to the next batch (more: it repairs every key)


def _c(name: str) -> SCol:
    return F.col(spark_name(name))


def _on(left: DataFrame, right: DataFrame, keys: list[str], prefix: str) -> SCol:
    """A null-safe equality of ``left``'s key columns with ``right``'s (renamed with ``prefix``)."""
    return reduce(
        lambda a, b: a & b, [left[spark_name(k)].eqNullSafe(right[f"{prefix}{i}"]) for i, k in enumerate(keys)]
    )


def _renamed(keys_df: DataFrame, keys: list[str], prefix: str) -> DataFrame:
    return keys_df.select(*[_c(k).alias(f"{prefix}{i}") for i, k in enumerate(keys)])


def semi(df: DataFrame, keys_df: DataFrame, keys: list[str], how: str = "left_semi") -> DataFrame:
    """``df``'s rows whose key is (``left_semi``) or is not (``left_anti``) among ``keys_df``'s,
    null keys equal to null keys."""
    right = _renamed(keys_df, keys, "_rk")
    return df.join(right, on=_on(df, right, keys, "_rk"), how=how)


def applied(cmds: DataFrame, batches: tuple[tuple[int, int, int | None], ...]) -> DataFrame:
    """The decoded commands (``_time``: the raw time, ``LONG_MIN`` when null) that the committed
    ``batches`` applied, with ``_et``, the time each took effect."""
    if not batches:
        return cmds.where(F.lit(False)).withColumn("_et", F.col("_time"))
    last_upper, last_w = batches[-1][1], batches[-1][2]
    if last_w is None:  # no committed batch read a command
        return cmds.where(F.lit(False)).withColumn("_et", F.col("_time"))
    lower_1 = batches[0][0]
    # (watermark, lower) of each batch that raised the watermark: the first batch whose
    # watermark reaches an offset applied a late command of that offset at its lower.
    steps, top = [], None
    for lower, _, w in batches:
        if w is not None and (top is None or w > top):
            steps.append((w, lower))
            top = w
    arr = F.array(*[F.struct(F.lit(w).cast(INT).alias("w"), F.lit(lo).cast(INT).alias("l")) for w, lo in steps])
    o = F.col("_off")
    first_seen = F.element_at(F.filter(arr, lambda s: s["w"] >= o), 1)["l"]
    done = (F.col("_time") < last_upper) & F.coalesce(o <= last_w, F.lit(True))
    et = F.greatest(F.col("_time"), F.lit(lower_1).cast(INT), F.coalesce(first_seen, F.lit(lower_1).cast(INT)))
    return cmds.where(done).withColumn("_et", et.cast(INT))


def feed_state(cfg: UpsertSink, done: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(the collection the applied commands ``done`` define: ``(columns, _error, _diff)``, the
    keys that have an applied command)."""
    keys, values = list(cfg.key_columns), cfg.value_columns
    types = {c.name: c.type for c in cfg.columns}
    keyed = done.where(~F.col("_unkeyed"))
    last = keyed.groupBy(*[_c(k) for k in keys]).agg(
        F.max(F.struct("_et", "_off", "_del", "_error", *[_c(v) for v in values])).alias("c")
    )
    state = last.where(~F.col("c._del")).select(
        *[_c(k) for k in keys],
        *[F.col(f"c.{spark_name(v)}").alias(v) for v in values],
        F.col("c._error").alias("_error"),
        F.lit(1).cast(INT).alias("_diff"),
    )
    unkeyed = done.where(F.col("_unkeyed")).select(
        *[F.lit(None).cast(types[k]).alias(k) for k in keys],
        *[F.lit(None).cast(types[v]).alias(v) for v in values],
        "_error",
        F.lit(1).cast(INT).alias("_diff"),
    )
    has = done.select(*[F.when(~F.col("_unkeyed"), _c(k)).alias(k) for k in keys]).distinct()
    return state.unionByName(unkeyed), has


def consolidated(cfg: UpsertSink, updates: DataFrame) -> DataFrame:
    """``(columns, _error, _diff)``: the sum of diffs per row, zero sums dropped."""
    cols = [*cfg.column_names, "_error"]
    return (
        updates.groupBy(*[_c(c) for c in cols]).agg(F.sum("_diff").cast(INT).alias("_diff")).where(F.col("_diff") != 0)
    )


def unrepairable(cfg: UpsertSink, touched: DataFrame, has: DataFrame, held: DataFrame | None, shard: DataFrame):
    """The touched keys the feed cannot define: no applied command, and a value before the
    foreign versions (or, that unknown, a value in the shard now)."""
    keys = list(cfg.key_columns)
    lost = semi(touched, has, keys, "left_anti")
    before = held if held is not None else shard.select(*[_c(k) for k in keys]).distinct()
    return semi(lost, before, keys)


def repair_frames(
    cfg: UpsertSink, cmds: DataFrame, persist: DataFrame, repair: DriftRepair, lower: int, upper: int
) -> tuple[DataFrame, DataFrame, DataFrame]:
    """(``fix``: the repair's updates at ``lower``; ``prior``: persist with each repairable touched
    key's history replaced by the feed's state at ``lower - 1``, for the batch's feedback; the
    unrepairable keys). ``cmds``: the whole feed, decoded with raw times
    (:func:`reconcile.kinds.upsert.decode` at ``LONG_MIN``)."""
    keys = list(cfg.key_columns)
    below = persist.where(F.col("_time") < upper)
    done = applied(cmds, repair.batches)
    if repair.keys is None:  # every key the shard or the feed has
        touched = below.select(*[_c(k) for k in keys]).unionByName(done.select(*[_c(k) for k in keys])).distinct()
    else:
        touched = repair.keys.select(*[_c(k) for k in keys]).distinct()
        done = semi(done, touched, keys)
        below_t = semi(below, touched, keys)
    shard = consolidated(cfg, below if repair.keys is None else below_t)
    state, has = feed_state(cfg, done)
    lost = unrepairable(cfg, touched, has, repair.held, shard).cache()
    fixed_shard = semi(shard, lost, keys, "left_anti")
    fix = consolidated(cfg, state.unionByName(fixed_shard.withColumn("_diff", -F.col("_diff")))).withColumn(
        "_time", F.lit(lower).cast(INT)
    )
    repaired = semi(touched, lost, keys, "left_anti")
    prior = semi(persist, repaired, keys, "left_anti").unionByName(
        state.withColumn("_time", F.lit(lower - 1).cast(INT)).select(*persist.columns)
    )
    return fix, prior, lost
