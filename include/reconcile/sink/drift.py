"""Drift: what foreign writers changed in the shard since a batch last repaired it, found by the
write before it computes its correction, and what each committed batch repaired.

A foreign Delta version changes data (:meth:`~reconcile.storage.delta.ShardTable.foreign_commits`).
Query and change-log batches compare the whole desired collection with the whole shard, so a batch
repairs every foreign change its write read. An upsert batch touches only its commands' keys, so
the write finds the keys the foreign versions changed (Delta time travel around each run of
foreign versions) and hands them to the kind (:class:`~reconcile.kinds.DriftRepair`), which
recomputes them from the feed. Each batch records what it repaired in its manifest
(``drift``: the foreign versions, the mode, the keys the feed cannot define), so that the reports
call a foreign version repaired only once a batch did repair it
(:func:`reconcile.standing.fates`).

Cost: nothing beyond reading the log's commit files when no foreign version changed data;
otherwise two time-travel reads of the table per run of foreign versions (the same the drift's
row count always took), and, for an upsert sink, one read of the whole feed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from reconcile import kinds
from reconcile.differential import consolidate, one_row
from reconcile.errors import SinkError, brief
from reconcile.log import event
from reconcile.model import COMMITTED
from reconcile.sql_names import spark_name
from reconcile.standing import record_of
from reconcile.storage import frames
from reconcile.storage.commits import runs_of
from reconcile.storage.delta import ShardTable
from reconcile.storage.ledger import Ledger
from reconcile.storage.ledger_rows import Batch

log = logging.getLogger(__name__)
KEYS_COLLECTED = 100_000  # more touched keys than this: the batch repairs every key


def keyed(cfg) -> bool:
    """Does the sink's kind repair by key (its batches touch only their commands' keys)?"""
    return kinds.repairs_by_key(cfg)


@dataclass
class Drift:
    """What a write repairs: the foreign ``versions``, the rows they changed below the batch's
    upper (None: not measurable), and, for a keyed kind, the repair the kind is asked for."""

    versions: list[int] = field(default_factory=list)
    rows: int | None = 0
    repair: kinds.DriftRepair | None = None

    def record(self, cfg, corr: kinds.Correction) -> dict:
        """The manifest's ``drift`` record."""
        out: dict = {"versions": self.versions, "mode": "rows"}
        if keyed(cfg):
            out.update(mode="keys", unrepairable_count=0, unrepairable=[])
            out.update(corr.repaired or {})
        return out


def _base(committed: list[Batch], cfg) -> tuple[int, Batch | None]:
    """(the Delta version after which foreign versions are not yet repaired, the last committed
    batch that recorded its repair): for a keyed kind, the last batch that repaired by key (a
    batch written before that never did: everything after -1 is looked at once)."""
    if not keyed(cfg):
        seen = [b.read_version for b in committed if b.read_version is not None]
        return (max(seen) if seen else -1), None
    recorded = [b for b in committed if b.read_version is not None and record_of(b) is not None]
    if not recorded:
        return -1, None
    last = max(recorded, key=lambda b: b.lower)
    return last.read_version or -1, last


def find(spark: SparkSession, ledger: Ledger, table: ShardTable, read_version: int, upper: int) -> Drift:
    """The foreign versions after the last repair up to ``read_version``, the rows they changed
    below ``upper``, and for a keyed kind the keys they touched (and those still unrepairable)."""
    cfg = table.cfg
    committed = ledger.batches(cfg.name, (COMMITTED,))
    base, last = _base(committed, cfg)
    foreign = table.foreign_commits(base, read_version)
    carried = (record_of(last) or {}).get("unrepairable") or [] if last is not None else []
    out = Drift(versions=[c.version for c in foreign])
    if not foreign and not carried:
        return out
    changed_keys: list[DataFrame] = []
    held: list[DataFrame] = []
    measurable = True
    key_cols = list(getattr(cfg, "key_columns", []) or [])
    total = 0
    read = _reader(spark, table)
    for first, last_v in runs_of(out.versions):
        try:
            after = read(last_v)
            before = read(first - 1)
            changed = consolidate(
                cfg, after.unionByName(before.withColumn("_diff", -F.col("_diff"))), partitioned=False
            ).cache()
            total += int(one_row(changed.where(F.col("_time") < upper).agg(F.sum(F.abs("_diff"))))[0] or 0)
            if not keyed(cfg):
                changed.unpersist()
            else:
                changed_keys.append(changed.select(*[F.col(spark_name(k)) for k in key_cols]))
                grouped = before.where(F.col("_time") < upper).groupBy(
                    *[F.col(spark_name(c)) for c in cfg.column_names], "_error"
                )
                had = grouped.agg(F.sum("_diff").alias("_n")).where(F.col("_n") != 0)
                held.append(had.select(*[F.col(spark_name(k)) for k in key_cols]))
        except Exception as exc:  # noqa: BLE001 - those versions were vacuumed
            event(
                log,
                f"cannot compare the table around foreign Delta versions {first}..{last_v} (vacuumed?): "
                f"{brief(exc, 200)}; "
                + ("this batch repairs every key" if keyed(cfg) else "the drift is repaired, not measured"),
                level=logging.WARNING,
                sink=cfg.name,
            )
            measurable = False
            break
    out.rows = total if measurable else None
    if not keyed(cfg):
        return out
    batches = tuple((b.lower, b.upper, b.source_offset) for b in sorted(committed, key=lambda b: b.lower))
    if not measurable:
        out.repair = kinds.DriftRepair(None, None, batches)
        return out
    schema = frames.schema(cfg)
    kschema = type(schema)([schema[k] for k in key_cols])
    carried_df = spark.createDataFrame([tuple(r.get(k) for k in key_cols) for r in carried], kschema)
    touched = _collected(spark, [*changed_keys, carried_df], kschema)
    before_keys = _collected(spark, [*held, carried_df], kschema)
    if touched is None:  # too many keys to name: repair every key
        out.repair = kinds.DriftRepair(None, None, batches)
    else:
        out.repair = kinds.DriftRepair(touched, before_keys, batches)
    return out


def _reader(spark: SparkSession, table: ShardTable):
    """How the shard's updates at a version are read to compare them: in the sink file's columns.
    While the file's schema change waits for the batch that applies it (this one), projected from
    the table's own columns as the batch's rewrite projects them (:func:`.evolve.projected`: a
    renamed column from its old name, a widened one cast, an added one null, a dropped one left
    out), so that the drift counts what the batch repairs (read by the file's names, a renamed
    column would be null on both sides and its changes unseen)."""
    from reconcile.model import ROW_KEYS
    from reconcile.sink import evolve

    try:
        plan = table.check_schema()
    except SinkError:  # a change no run applies (the batch refuses it; check's report goes on): as stored
        plan = None
    if not plan:
        return lambda version: frames.read_updates(spark, table, version)
    return lambda version: evolve.projected(spark, table, version, plan).drop(*ROW_KEYS)


def _collected(spark: SparkSession, frames_: list[DataFrame], schema) -> DataFrame | None:
    """The distinct keys of ``frames_``, brought to the driver and back as a small frame (so the
    batch's own action does not read the table's old versions again); None if there are too many."""
    keys = frames_[0]
    for f in frames_[1:]:
        keys = keys.unionByName(f)
    rows = keys.distinct().limit(KEYS_COLLECTED + 1).collect()
    if len(rows) > KEYS_COLLECTED:
        return None
    return spark.createDataFrame([tuple(r) for r in rows], schema)
