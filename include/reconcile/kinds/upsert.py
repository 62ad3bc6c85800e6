"""Upsert sinks: keyed commands turned into the shard's differential collection (pure transforms).

A feed holds commands ``(key, value or delete, time, offset)``. The shard holds one value per
key. For a batch ``(lower, upper)`` (:func:`correction`; :class:`reconcile.kinds.UpsertKind` is
the kind's face to the stages):

1. **Eligibility.** A command is applied by the first batch whose read of the feed sees it with
   a time below the batch's upper. Offsets grow with arrival (a CDC log position, a Kafka
   offset of a one-partition export), so each committed batch records the highest offset of
   the feed it read (``source_offset``, the *watermark*). The next batch applies commands with
   ``lower <= time < upper``, plus those with ``time < lower`` whose offset is above the
   watermark: they arrived after their time's batch was written. Those are **late**: they are
   applied at ``lower`` (time is advanced, as in the correction formula) and counted in the
   ledger (``late_commands``), never dropped. Commands at or after ``upper`` wait. The first
   batch of a shard (no watermark yet) applies everything below its upper, at ``lower`` for
   times before it. The work of a batch is bounded by the (key, time) pairs it selects.
2. **Highest offset wins** per ``(key, effective time)``: a replayed command changes nothing.
3. **Feedback.** For each key that receives a command, whatever the shard holds for it as of
   ``lower - 1`` (every row with that key, ok or error, with its count) is retracted at the
   key's first command time; every later command retracts the previous command's value. A
   delete retracts only. A key that was tampered into two values is repaired by its next
   command.
4. **Errors are values.** A value that does not fit the schema (or a null in a non-nullable
   value column) becomes the key's value as an error row (key columns kept, so the next good
   command retracts it). A command whose key has a null, or whose time or offset is not an
   integer, cannot be keyed or placed: it becomes an error row of its own (diff 1) and is
   reported once (by offset, or by time when the offset is unreadable).

No Python UDFs. The feed is read once per batch (:func:`unapplied`): only rows that can hold a
command the shard has not applied pass a filter on the raw time and offset columns, which Spark
pushes down to the feed's files (a Parquet row group or a Delta file whose statistics say that all
its commands are older than ``lower`` and at or below the watermark is not read), and the feed's
progress (highest offset, eligible and late commands) is observed on those rows in the write's
own Spark action. One repartition by key serves the per-(key, time) aggregation, the per-key
window and the commands that cannot be keyed; the feedback read is a consolidation of the
shard's rows of the touched keys.
"""

from __future__ import annotations

import uuid

from pyspark.sql import Column as SCol
from pyspark.sql import DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F

from reconcile.checksums import BatchChecks
from reconcile.config import UpsertSink
from reconcile.differential import as_of, consolidate, partition_of
from reconcile.kinds.decode import INTEGRAL, fit, lossy, raw_text, read_source, require_castable, require_columns
from reconcile.kinds.protocol import UPSERT_SOURCE, Bounds, Correction, FeedProgress
from reconcile.sql_names import spark_name

INT = "bigint"
# The shard as read counts into both checksums: the desired collection is the shard with the
# touched keys' values replaced (:func:`upsert_correction`).
PERSIST_SIDES = {"desired": 1, "shard": 1}


def correction(spark: SparkSession, cfg: UpsertSink, persist: DataFrame, bounds: Bounds) -> Correction:
    """The batch's correction (:meth:`reconcile.kinds.Kind.correction`): the feed's eligible
    commands against ``persist``, and the repair of the foreign writes ``bounds.repair`` names."""
    lower, upper, watermark = bounds.lower, bounds.upper, bounds.watermark
    feed, observation = unapplied(cfg, read_feed(spark, cfg), lower, upper, watermark)
    cmds = commands(cfg, feed, lower, upper, watermark)
    fix = prior = None
    repaired = None
    read: tuple[int, int] | None = None
    if bounds.repair is not None:
        fix, prior, repaired = _repair(spark, cfg, persist, bounds)
    elif bounds.checks is None or bounds.checks.carried is not None:
        narrowed = _files_of_keys(spark, cfg, bounds)
        if narrowed is not None:
            persist, read = narrowed[0], (narrowed[1], narrowed[2])
    first = bounds.empty_shard and fix is None  # nothing to retract: the commands' updates alone
    updates = upsert_correction(cfg, cmds, persist, lower, bounds.checks, prior=prior, fix=fix, empty=first)
    return Correction(updates, lambda: progress(observation, watermark), repaired, files_read=read)


# How many distinct keys a batch's commands may touch for it to read only the shard's files that
# can hold them (each file's key range from its statistics): beyond, the shard is read whole.
FEW_KEYS = 200_000
INTEGRAL_KEYS = ("tinyint", "smallint", "int", "bigint")


def _files_of_keys(spark: SparkSession, cfg: UpsertSink, bounds: Bounds) -> tuple | None:
    """(the shard's files that can hold the batch's keys, files read, files in all), from the
    files' key statistics (:mod:`reconcile.storage.feed_stats`); None when the shard is read
    whole: no reader of files (:class:`Bounds`), a first key column that is not an integer, or
    more than :data:`FEW_KEYS` keys. The batch's keys are bounded by the feed's statistics where
    it has them (no job), else by one Spark job that reads the commands' first key column (the
    feed's files pruned as for the batch)."""
    first = cfg.key_columns[0]
    types = {c.name: c.type for c in cfg.columns}
    if bounds.files_holding is None or bounds.empty_shard or types[first] not in INTEGRAL_KEYS:
        return None
    ranges = None
    if bounds.feed_key_ranges is not None:
        ranges = bounds.feed_key_ranges(cfg.source, first, cfg.time_column, cfg.offset_column)
    if ranges is None:
        raw = read_feed(spark, cfg)
        keep = could_apply(cfg, bounds.lower, bounds.watermark, _types(raw))
        cmds = commands(cfg, raw if keep is None else raw.where(keep), bounds.lower, bounds.upper, bounds.watermark)
        found = cmds.where(~F.col("_unkeyed")).select(_c(first).alias("k")).distinct().limit(FEW_KEYS + 1)
        keys = found.toArrow().column(0).to_pylist()  # Arrow: no Python object per row on the way
        if len(keys) > FEW_KEYS:
            return None
        ranges = [(k, k) for k in sorted(keys)]
    return bounds.files_holding(first, ranges)


def _repair(spark: SparkSession, cfg: UpsertSink, persist: DataFrame, bounds: Bounds) -> tuple:
    """(fix, prior, what the ledger records) of the foreign writes ``bounds.repair`` names
    (:mod:`reconcile.kinds.upsert_drift`); one Spark job finds the keys it cannot repair."""
    from reconcile.kinds import upsert_drift as drift

    repair = bounds.repair
    assert repair is not None
    everything = decode(cfg, read_feed(spark, cfg), drift.LONG_MIN)
    fix, prior, lost = drift.repair_frames(cfg, everything, persist, repair, bounds.lower, bounds.upper)
    keys = list(cfg.key_columns)
    rows = lost.limit(drift.CARRY + 1).collect()
    lost.unpersist()
    record = {
        "mode": "keys" if repair.keys is not None else "all",
        "unrepairable_count": len(rows),
        "unrepairable": [{k: r[k] for k in keys} for r in rows[: drift.CARRY]],
    }
    return fix, prior, record


def _c(name: str) -> SCol:
    return F.col(spark_name(name))


def _feed_columns(cfg: UpsertSink) -> list[str]:
    """An upsert feed's time and offset columns."""
    return [cfg.time_column, cfg.offset_column]


def read_feed(spark: SparkSession, cfg: UpsertSink) -> DataFrame:
    """The sink's command feed, raw (validated per command in :func:`commands`)."""
    return check_feed(cfg, read_source(spark, cfg, cfg.source, "upsert.source"))


def check_feed(cfg: UpsertSink, df: DataFrame) -> DataFrame:
    """A raw feed with every column the sink reads, each of a type that can become what the
    sink needs (else a SourceError, before any row is read)."""
    needed = cfg.column_names + _feed_columns(cfg) + ([cfg.delete_column] if cfg.delete_column else [])
    require_columns(cfg, df, needed, UPSERT_SOURCE)
    targets = {c.name: c.type for c in cfg.columns}
    targets.update(dict.fromkeys(_feed_columns(cfg), INT))
    if cfg.delete_column:
        targets[cfg.delete_column] = "string"
    require_castable(cfg, df, UPSERT_SOURCE, targets, counters=tuple(_feed_columns(cfg)))
    return df


def _raw_time(cfg: UpsertSink, types: dict[str, str] | None = None) -> tuple[SCol, SCol]:
    """The feed's time and offset as bigint (null: not an integer); ``types``: the feed's
    column types by lowercase name (an exact fraction check)."""
    traw, oraw = (_c(c) for c in _feed_columns(cfg))
    have = [(types or {}).get(c.lower()) for c in _feed_columns(cfg)]
    t = F.when(~lossy(traw, traw.try_cast(INT), INT, have[0]), traw.try_cast(INT))
    o = F.when(~lossy(oraw, oraw.try_cast(INT), INT, have[1]), oraw.try_cast(INT))
    return t, o


def _types(feed: DataFrame) -> dict[str, str]:
    return {f.name.lower(): f.dataType.simpleString() for f in feed.schema.fields}


def eligibility(
    cfg: UpsertSink, lower: int, upper: int, watermark: int | None, types: dict[str, str] | None = None
) -> tuple[SCol, SCol]:
    """(eligible, late) over a raw feed: see the module doc, point 1."""
    t, o = _raw_time(cfg, types)
    if watermark is None:
        return F.coalesce(t < upper, F.lit(True)), F.lit(False)
    new = F.coalesce(o > watermark, F.lit(False))
    eligible = F.when(t.isNull(), new).otherwise((t < upper) & ((t >= lower) | new))
    late = F.coalesce((t < lower) & new, F.lit(False))
    return eligible, late


def could_apply(cfg: UpsertSink, lower: int, watermark: int | None, types: dict[str, str]) -> SCol | None:
    """A filter on the raw time and offset columns that Spark pushes down to the feed's files:
    it drops only rows with ``time < lower`` and ``offset <= watermark`` (both integers), which no
    batch from ``lower`` on applies (:func:`eligibility`) and which cannot raise the watermark.
    None (read every row) before the first watermark, or when a time or offset column is not
    integral (its raw values do not compare as the sink's integers do)."""
    if watermark is None or any(types.get(c.lower()) not in INTEGRAL for c in _feed_columns(cfg)):
        return None
    t, o = (_c(c) for c in _feed_columns(cfg))
    return (t >= lower) | (o > watermark) | t.isNull() | o.isNull()


def unapplied(
    cfg: UpsertSink, feed: DataFrame, lower: int, upper: int, watermark: int | None
) -> tuple[DataFrame, Observation]:
    """The rows of a raw feed that can hold a command the shard has not applied (or raise the
    watermark), with the feed's progress observed on them: the highest offset (the new
    watermark, with the old one), commands eligible, late ones: ``max_offset``, ``commands`` and
    ``late`` in ``Observation.get`` after the action that reads them."""
    types = _types(feed)
    keep = could_apply(cfg, lower, watermark, types)
    rows = feed if keep is None else feed.where(keep)
    _, o = _raw_time(cfg, types)
    eligible, late = eligibility(cfg, lower, upper, watermark, types)
    observation = Observation(f"feed-progress-{uuid.uuid4().hex}")
    observed = rows.observe(
        observation,
        F.max(o).alias("max_offset"),
        F.sum(F.when(eligible, 1).otherwise(0)).cast(INT).alias("commands"),
        F.sum(F.when(eligible & late, 1).otherwise(0)).cast(INT).alias("late"),
    )
    return observed, observation


def progress(observation: Observation, watermark: int | None) -> FeedProgress:
    """The feed's progress from :func:`unapplied`'s observation (after the action that read its
    rows): the new watermark is the highest offset read, or the old one."""
    got = observation.get
    offsets = [x for x in (watermark, got.get("max_offset")) if x is not None]
    return FeedProgress(
        commands=int(got.get("commands") or 0),
        late_commands=int(got.get("late") or 0),
        source_offset=max(offsets) if offsets else None,
    )


def commands(cfg: UpsertSink, feed: DataFrame, lower: int, upper: int, watermark: int | None) -> DataFrame:
    """Eligible commands, validated: key and value columns in the sink's types, ``_error``
    (a problem of the value, or of the command), ``_unkeyed`` (cannot be keyed or placed),
    ``_del``, ``_time`` (effective: at least ``lower``) and ``_off``."""
    have = _types(feed)
    eligible, _ = eligibility(cfg, lower, upper, watermark, have)
    return decode(cfg, feed.where(eligible), lower, have)


def decode(cfg: UpsertSink, feed: DataFrame, lower: int, have: dict[str, str] | None = None) -> DataFrame:
    """Commands of a raw feed, validated (see :func:`commands`, which selects the eligible ones
    first); ``_time`` is the command's time advanced to ``lower`` (a null time: ``lower``)."""
    have = have if have is not None else _types(feed)
    t, o = _raw_time(cfg, have)
    types = {c.name: c for c in cfg.columns}
    keys, values = list(cfg.key_columns), cfg.value_columns

    fits = {n: fit(_c(n), have.get(n.lower()), types[n].type) for n in keys + values}
    cast = {n: val for n, (val, _) in fits.items()}
    if cfg.delete_column:
        is_delete = F.coalesce(_c(cfg.delete_column).cast("string").isin(*cfg.delete_values), F.lit(False))
    else:
        is_delete = F.lit(True)
        for n in values:
            is_delete = is_delete & _c(n).isNull()
    value_problems = []
    for n in values:  # a delete's values do not matter
        value_problems.append(F.when(~is_delete & fits[n][1], F.lit(f"column '{n}' does not fit {types[n].type}")))
    for n in values:
        if not types[n].nullable:
            value_problems.append(F.when(~is_delete & _c(n).isNull(), F.lit(f"column '{n}' is null but not nullable")))
    key_problems = []
    for n in keys:
        key_problems.append(F.when(_c(n).isNull(), F.lit(f"key column '{n}' is null")))
        key_problems.append(F.when(fits[n][1], F.lit(f"key column '{n}' does not fit {types[n].type}")))
    key_problems.append(F.when(t.isNull(), F.lit(f"time column '{cfg.time_column}' is null or not an integer")))
    key_problems.append(F.when(o.isNull(), F.lit(f"offset column '{cfg.offset_column}' is null or not an integer")))

    raw_json = F.to_json(
        F.struct(*[raw_text(_c(c), have.get(c.lower())).alias(c) for c in cfg.column_names + _feed_columns(cfg)])
    )
    key_msg = F.concat_ws("; ", *key_problems)
    value_msg = F.concat_ws("; ", *value_problems)
    unkeyed = key_msg != ""
    error = F.when(
        unkeyed, F.concat(F.lit("upsert command cannot be applied: "), key_msg, F.lit(" in "), raw_json)
    ).when(value_msg != "", F.concat(value_msg, F.lit(" in "), raw_json))
    out = feed.select(
        *[cast[n].alias(n) for n in keys],
        *[cast[n].alias(n) for n in values],
        error.alias("_error"),
        unkeyed.alias("_unkeyed"),
        is_delete.alias("_del"),
        F.greatest(F.coalesce(t, F.lit(lower)), F.lit(lower)).cast(INT).alias("_time"),
        o.alias("_off"),
    )
    # An error keeps the key (unless the key itself is bad) and drops the values: they are in the message.
    return out.select(
        *[F.when(~F.col("_unkeyed"), _c(n)).alias(n) for n in keys],
        *[F.when(F.col("_error").isNull(), _c(n)).cast(types[n].type).alias(n) for n in values],
        "_error",
        "_unkeyed",
        F.when(F.col("_error").isNull(), F.col("_del")).otherwise(False).alias("_del"),
        "_time",
        "_off",
    )


def upsert_correction(
    cfg: UpsertSink,
    cmds: DataFrame,
    persist: DataFrame,
    lower: int,
    checks: BatchChecks | None = None,
    *,
    prior: DataFrame | None = None,
    fix: DataFrame | None = None,
    empty: bool = False,
) -> DataFrame:
    """The batch's updates (update frame plus ``_part``), consolidated per (row, time).

    ``empty``: the shard holds nothing (its first batch): no feedback, and the commands' updates
    are written as they come out of their one shuffle, in the key's partitions, sorted by key
    (each (row, time) once: a command that repeats the value before it adds nothing).

    ``checks`` observes, on the way, what the kind says the shard holds as of ``upper - 1``: the
    shard as read, each touched key's value as of ``lower - 1`` replaced by its last command's
    value (the last insert, unless that command deletes), plus the unkeyed commands, plus the
    repair of foreign writes. ``fix``: that repair's updates (:mod:`reconcile.kinds.upsert_drift`);
    ``prior``: the shard the commands' keys take their previous values from (default persist)."""
    keys, values = list(cfg.key_columns), cfg.value_columns
    cols = cfg.column_names
    # One shuffle by key for every command: the commands that cannot be keyed (null keys) travel
    # with the others and are told apart after the aggregation by ``_n``, how many of them share
    # a (time, error), so that every frame below reads the one shuffle (a filter on a column that
    # is not aggregated is not pushed below it: the feed is read once).
    # The first batch's shuffle puts each key in its hash partition of the shard (``_part``, one
    # task each), which its write keeps; the aggregation and window below group by ``_part`` too,
    # so that they need no shuffle of their own. A later batch's commands are few: a shuffle by
    # key that Spark may pack into fewer tasks.
    parted = cmds.withColumn("_part", partition_of(cfg))
    shuffled = parted.repartitionById(cfg.partitions, "_part") if empty else parted.repartition(*[_c(k) for k in keys])
    # 2. Highest offset wins per (key, time); ties (a replay) resolve to one command.
    payload = F.struct(F.col("_off"), F.col("_del"), F.col("_error"), *[_c(v) for v in values])
    unkeyed_error = F.when(F.col("_unkeyed"), F.col("_error")).alias("_ue")
    per_time = shuffled.groupBy("_part", *[_c(k) for k in keys], F.col("_time"), unkeyed_error).agg(
        F.max(payload).alias("c"), F.sum(F.col("_unkeyed").cast(INT)).alias("_n")
    )
    by_key = Window.partitionBy("_part", *[_c(k) for k in keys])
    ordered = per_time.select(
        "_part",
        *[_c(k) for k in keys],
        "_time",
        "c",
        "_n",
        F.lag("c").over(by_key.orderBy("_time")).alias("prev"),
        F.min("_time").over(by_key).alias("_first"),
        *([F.max("_time").over(by_key).alias("_last")] if checks is not None else []),
    )
    keyed = F.col("_n") == 0  # keyed commands' windows hold no unkeyed ones (their keys are not null)

    # Each (key, time) gives, in one pass over the window: its command's value (unless it deletes),
    # the retraction of the previous command's value (unless that one deleted), or, for commands
    # that cannot be keyed, their error row counted ``_n`` times. ``_desired``: the update counts
    # into the desired side's checksum (a key's last insert, at its last command's time, is the
    # value it ends with; the unkeyed commands' rows).
    types = {c.name: c.type for c in cfg.columns}

    def update(source: str | None, diff: SCol, desired: SCol) -> SCol:
        return F.struct(
            *[(F.col(f"{source}.{spark_name(v)}") if source else F.lit(None).cast(types[v])).alias(v) for v in values],
            F.col(f"{'c' if source is None else source}._error").alias("_error"),
            diff.cast(INT).alias("_diff"),
            desired.alias("_desired"),
        )

    final = F.col("_time") == F.col("_last") if checks is not None else F.lit(False)
    # A command whose value and error are the previous command's changes nothing at its time:
    # in the first batch (its updates are not consolidated) it adds neither of its two updates.
    same = F.lit(False)
    if empty:
        same = F.col("prev").isNotNull() & ~F.col("c._del") & ~F.col("prev._del")
        for f in ["_error", *values]:
            same = same & F.col(f"c.{spark_name(f)}").eqNullSafe(F.col(f"prev.{spark_name(f)}"))
    updates = F.array(
        F.when(keyed & ~F.col("c._del") & ~same, update("c", F.lit(1), final)),
        F.when(
            keyed & ~same & F.col("prev").isNotNull() & ~F.col("prev._del"), update("prev", F.lit(-1), F.lit(False))
        ),
        F.when(~keyed, update(None, F.col("_n"), F.lit(True))),
    )
    generated = (
        ordered.select("_part", *[_c(k) for k in keys], "_time", F.explode(updates).alias("u"))
        .where(F.col("u").isNotNull())
        .select(
            "_part",
            *[_c(k) for k in keys],
            *[F.col(f"u.{spark_name(v)}").alias(v) for v in values],
            "u._error",
            "_time",
            "u._diff",
            "u._desired",
        )
    )
    if empty:  # the first batch: its updates are the shard after it, in the key's partitions
        if checks is not None:
            checks.count_correction_into("desired")
        return generated.select("_part", *cols, "_error", "_time", "_diff")
    if checks is not None:
        generated = checks.observe(generated, "commands", {"desired": 1}, where=F.col("_desired"))

    # 3. Feedback: everything the shard holds for a touched key as of lower - 1, retracted at
    # the key's first command.
    # (``c`` is never null: naming it keeps the aggregation, and the shuffle of the feed below it,
    # the same as the other frames', so that Spark reuses them instead of reading the feed again.)
    first = keyed & (F.col("_time") == F.col("_first")) & F.col("c").isNotNull()
    touched = ordered.where(first).select(*[_c(k) for k in keys], "_first")
    # Only the touched keys' history is read: one join (the touched keys are broadcast). The join is
    # null-safe (no touched key is null) so that Spark infers no "key is not null" filter to
    # push into the touched keys' side: it stays the shuffle of the feed the other frames read.
    probe = touched.select(*[_c(k).alias(f"_k{i}") for i, k in enumerate(keys)], "_first")
    feedback = persist if prior is None else prior
    on = [feedback[spark_name(k)].eqNullSafe(probe[f"_k{i}"]) for i, k in enumerate(keys)]
    joined = feedback.where(F.col("_time") <= lower - 1).join(probe, on=on, how="inner")
    history = joined.drop(*[f"_k{i}" for i in range(len(keys))])
    # Each update of that history negated at the key's first command: the consolidation of the
    # whole correction sums them per row (no shuffle of their own).
    retracted = history.select(
        *[_c(c) for c in cols],
        "_error",
        F.col("_first").alias("_time"),
        (-F.col("_diff")).cast(INT).alias("_diff"),
    )

    order = [*cols, "_error", "_time", "_diff"]
    branches = [generated.drop("_part"), retracted]
    if fix is not None:
        branches.append(fix if checks is None else checks.observe(fix, "repair", {"desired": 1}))
    if checks is not None:
        branches[1] = checks.observe(retracted, "retracted", {"desired": 1})
        # The shard as read below upper, on both sides: carried from the previous batch, or
        # observed in a branch of the union that adds no row (the join above may stop reading
        # persist when no key is touched).
        if checks.carried is not None:
            checks.carry(PERSIST_SIDES)
        else:
            below = F.col("_time") < checks.upper
            shard = checks.observe(persist, "persist", PERSIST_SIDES, where=below)
            branches.append(shard.where(F.spark_partition_id() < 0))
    both = branches[0].select(*order)
    for branch in branches[1:]:
        both = both.unionByName(branch.select(*order))
    both = both.withColumn("_part", partition_of(cfg))  # the key's: one task per partition
    return consolidate(cfg, both.repartitionById(cfg.partitions, "_part"))


def violations(
    cfg: UpsertSink, updates: DataFrame, t: int, keys: DataFrame | None = None, limit: int = 10
) -> list[str]:
    """Upsert invariants as of ``t``: each key has at most one value (ok or error), and every
    consolidated count is 1. ``keys`` restricts the check (e.g. to the keys a batch touched)."""
    kcols = list(cfg.key_columns)
    if keys is not None:
        updates = updates.join(keys.select(*[_c(k) for k in kcols]).distinct(), on=kcols, how="left_semi")
    snap = as_of(cfg, updates, t)
    for k in kcols:
        snap = snap.where(_c(k).isNotNull())
    # One pass: per key, how many values and which counts are not 1.
    per_key = (
        snap.groupBy(*[_c(k) for k in kcols])
        .agg(
            F.count(F.lit(1)).alias("_values"),
            F.collect_list(
                F.when(F.col("_diff") != 1, F.struct(*[_c(c) for c in cfg.column_names], "_error", "_diff"))
            ).alias("_bad"),
        )
        .where((F.col("_values") > 1) | (F.size("_bad") > 0))
    )
    out = []
    for r in per_key.limit(limit).collect():
        d = r.asDict(recursive=True)
        key = {k: d[k] for k in kcols}
        if d["_values"] > 1:
            out.append(f"key {key} has {d['_values']} values as of {t} (must be at most 1)")
        for b in d["_bad"]:
            row = {c: b[c] for c in cfg.column_names}
            out.append(f"row {row} has count {b['_diff']} as of {t} (must be 1)")
    return out
