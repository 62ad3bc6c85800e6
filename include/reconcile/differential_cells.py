"""A query's correction from one scan of its desired side: row keys summed into cells.

:func:`reconcile.differential.hash_first` compares the row keys of both sides by shuffling one
narrow row per row of each side, then reads the desired side a second time for the changed rows.
This module computes the same correction reading the desired side once and shuffling neither
side's rows:

1. **Persist's cells.** Each shard row's 128-bit key (stored, :func:`~reconcile.storage.frames.
   read_keyed`: a narrow read) is added, times its ``_diff``, into one cell of each of
   :data:`TABLES` tables of cells (an invertible Bloom lookup table: per cell, the sum of the
   diffs and of the key's four 32-bit limbs times the diff). One small aggregate, collected.
2. **One scan of the desired side.** Each desired row is hashed once; a row whose first key half
   is no shard row's (a broadcast existence join with the shard's stored key halves) is new: kept
   whole, with its count. Every other row is added into its cells, as persist's were. One
   aggregate whose groups are the cells and the new rows, cached: the only shuffle is the cells'
   partial sums and the new rows.
3. **The difference of the cells**, desired's minus persist's, holds only the keys that are shard
   rows' and whose count changed: deleted rows, rows whose count changed, rows retracted before
   and desired again. It is peeled on the driver (:func:`peel`): a cell holding one key gives that
   key and its change of count, which is then taken out of its other cells, until every cell is
   0. The rows of those keys are read from the shard (their content is the shard's: the same key).
4. The correction: the new rows (+count) and the peeled keys' rows (their change of count), no
   consolidation needed (a new row's key is no shard row's; each peeled key comes once).

When the cells do not peel (more changed keys than they hold, about 0.8 a cell; or a
collision of the first key half, about 2^-64 per pair of rows) :class:`NotPeeled` is raised and
the caller falls back to :func:`~reconcile.differential.hash_first`. Anything the cells get wrong
(a 2^-128 event) the batch's checksums catch, as they catch hash-first's collisions: the batch is
then computed again comparing every row in full.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager, nullcontext
from time import perf_counter

from pyspark.sql import Column as SCol
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from reconcile.config import SinkConfig
from reconcile.differential import HASH_COLUMN, _key, cached, label_jobs, release, row_columns, with_row_key
from reconcile.model import ROW_KEYS
from reconcile.sql_names import spark_name

log = logging.getLogger(__name__)

TABLES = 3  # cells a key is added into, one per table (peeling works below ~0.81 keys per cell)
CELLS = 1 << 15  # cells per table: about 80,000 changed shard keys peel
RETRY_FACTOR = 8  # more: a second scan with 8 times the cells, then hash-first
CELL_SHIFT = 21  # table t's cell is bits [21 t, 21 t + log2(cells)) of the key's second half
# Off unless RECONCILE_ONE_SCAN=1: measured slower than hash-first (bench/profile_query.py, alone,
# 2 cores): 43.6 s against 32.1 s at 10M rows / 0.1% changed, 16.3 s against 9.1 s at 1M / 1%.
# The broadcast existence join alone costs 5.6 s at 10M (building the relation of 10M key halves),
# the cells' explode and aggregate 4.5 s, the shard's rows of the changed keys a full read (4 s).
ENV = "RECONCILE_ONE_SCAN"
CELLS_ENV = "RECONCILE_TEST_CELLS"  # cells per table (a test forces a fallback with few)
BROADCAST_CONF = "spark.sql.autoBroadcastJoinThreshold"
BROADCAST_BYTES = 4 << 30  # the planner's estimate of the key halves is of the whole files' width
_LOW = 0xFFFFFFFF


class NotPeeled(Exception):
    """The cells did not resolve every changed key: compute the correction another way."""


def wanted(rows: int | None, desired: DataFrame) -> bool:
    """Whether a batch over a shard of ``rows`` update rows computes its correction here: only
    when asked (``RECONCILE_ONE_SCAN=1``, see above), never over Spark Connect."""
    if getattr(desired, "_jdf", None) is None:
        return False
    return os.environ.get(ENV) == "1" and rows is not None


def cells_per_table() -> int:
    return int(os.environ.get(CELLS_ENV) or CELLS)


def _cells(k2: SCol, per_table: int) -> list[SCol]:
    mask = F.lit(per_table - 1)
    return [F.lit(t * per_table) + F.shiftrightunsigned(k2, CELL_SHIFT * t).bitwiseAND(mask) for t in range(TABLES)]


def cells_of(k2: int, per_table: int) -> list[int]:
    """The cells of a key whose second half is ``k2`` (a signed 64-bit int): :func:`_cells`."""
    u = k2 & 0xFFFFFFFFFFFFFFFF
    return [t * per_table + ((u >> (CELL_SHIFT * t)) & (per_table - 1)) for t in range(TABLES)]


def _sums(diff: SCol) -> list[SCol]:
    """A cell's sums: the diffs, and each key half's and the key's check hash's (:func:`check_hash`)
    low (unsigned) and high (signed) 32 bits times the diff. A cell sums about rows / cells rows:
    far from a BIGINT's bounds."""
    out = [F.sum(diff).alias("_n")]
    for i, k in enumerate((F.col("_k1"), F.col("_k2"), F.xxhash64(F.col("_k1"), F.col("_k2")))):
        out += [
            F.sum(k.bitwiseAND(F.lit(_LOW)) * diff).alias(f"_lo{i}"),
            F.sum(F.shiftright(k, 32) * diff).alias(f"_hi{i}"),
        ]
    return out


SUMS = ("_n", "_lo0", "_hi0", "_lo1", "_hi1", "_lo2", "_hi2")
_M = 0xFFFFFFFFFFFFFFFF
_P1, _P2, _P3, _P4, _P5 = (
    0x9E3779B185EBCA87,
    0xC2B2AE3D27D4EB4F,
    0x165667B19E3779F9,
    0x85EBCA77C2B2AE63,
    0x27D4EB2F165667C5,
)


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M


def _xxh64_long(v: int, seed: int) -> int:
    """XXH64 of one 64-bit value (8 bytes, little-endian) with ``seed``: Spark's ``hashLong``."""
    h = (seed + _P5 + 8) & _M
    h ^= (_rotl((v & _M) * _P2 & _M, 31) * _P1) & _M
    h = (_rotl(h, 27) * _P1 + _P4) & _M
    h ^= h >> 33
    h = h * _P2 & _M
    h ^= h >> 29
    h = h * _P3 & _M
    h ^= h >> 32
    return h


def check_hash(k1: int, k2: int) -> int:
    """``xxhash64(k1, k2)`` as Spark computes it (seed 42, each value's hash the next one's seed),
    signed: the sum a pure cell's key must match (a cell that holds several keys passes with
    probability 2^-64)."""
    return _signed(_xxh64_long(k2, _xxh64_long(k1, 42)))


def _limbs(x: int) -> tuple[int, int]:
    return x & _LOW, x >> 32


def _signed(x: int) -> int:
    x &= 0xFFFFFFFFFFFFFFFF
    return x - (1 << 64) if x >= 1 << 63 else x


def peel(desired: dict[int, tuple], persist: dict[int, tuple], per_table: int) -> list[tuple[int, int, int]]:
    """The keys whose count differs between the two sides' cells, each as ``(k1, k2, change)``:
    the cells' difference peeled one pure cell (a cell holding one key: its sums ``n`` times one
    key's limbs, that key's check hash among them and the cell among its cells) at a time. Raises
    :class:`NotPeeled` when some cells stay non-zero."""
    zero = (0,) * len(SUMS)
    res: dict[int, list[int]] = {}
    for c in desired.keys() | persist.keys():
        r = [a - b for a, b in zip(desired.get(c, zero), persist.get(c, zero), strict=True)]
        if any(r):
            res[c] = r
    budget = len(res) + 1  # a key takes at least one non-zero cell: more peels than that are wrong
    found: list[tuple[int, int, int]] = []
    todo = list(res)
    while todo:
        c = todo.pop()
        got = res.get(c)
        if got is None or got[0] == 0 or any(x % got[0] for x in got[1:]):
            continue
        n = got[0]
        lo0, hi0, lo1, hi1, lo2, hi2 = (x // n for x in got[1:])
        if not (0 <= lo0 <= _LOW and 0 <= lo1 <= _LOW and -(1 << 31) <= hi0 < 1 << 31 and -(1 << 31) <= hi1 < 1 << 31):
            continue
        k1, k2 = _signed((hi0 << 32) | lo0), _signed((hi1 << 32) | lo1)
        cells = cells_of(k2, per_table)
        if c not in cells or _limbs(check_hash(k1, k2)) != (lo2, hi2):
            continue
        found.append((k1, k2, n))
        if len(found) > budget:
            break
        for cell in cells:
            now = res.setdefault(cell, [0] * len(SUMS))
            for i, x in enumerate((1, lo0, hi0, lo1, hi1, lo2, hi2)):
                now[i] -= n * x
            if any(now):
                todo.append(cell)
            else:
                del res[cell]
    if res:
        raise NotPeeled(f"{len(res)} cell(s) hold more than one changed key")
    return found


def correction(
    cfg: SinkConfig, desired: DataFrame, persist: DataFrame, time: SCol, checks=None, *, per_table: int | None = None
) -> DataFrame:
    """The correction :func:`~reconcile.differential.hash_first` computes, from one scan of
    ``desired`` (see the module doc). ``persist`` carries the row key (stored or hashed when
    read). Raises :class:`NotPeeled` (after undoing its observations) when the cells do not
    resolve; the caller then computes it otherwise."""
    spark = desired.sparkSession
    per_table = per_table or cells_per_table()
    cols = row_columns(cfg)
    keep = [F.col(spark_name(c)) for c in cols]
    k1, k2 = (F.col(k) for k in ROW_KEYS)
    part = F.pmod(k1, F.lit(cfg.partitions)).cast("int")
    mark = checks.mark() if checks is not None else 0
    started = perf_counter()

    # 1. persist's cells (narrow: the stored key and _diff)
    stored = with_row_key(cfg, persist)
    p = stored.select(k1, k2, F.col("_diff"))
    if checks is not None:
        if checks.carried is None:
            p = checks.observe_hashed(
                p.select("*", k1.alias(HASH_COLUMN), part.alias("_part")), "persist", {"shard": 1}
            )
        else:
            checks.carry({"shard": 1})
    narrow = p.select(_key(k1).alias("_k1"), _key(k2).alias("_k2"), F.col("_diff"))
    label_jobs(spark, "reconcile: one scan, 1 (the shard's row keys into cells)")
    with checks.observing(spark) if checks is not None else nullcontext():
        p_cells = _collect_cells(
            narrow.select("*", F.explode(F.array(*_cells(F.col("_k2"), per_table))).alias("_cell"))
        )

    # 2. one scan of desired: new rows whole, the others into cells
    d = with_row_key(cfg, desired).select(*keep, F.col("_diff"), k1, k2)
    if checks is not None:
        d = checks.observe_hashed(
            d.select("*", k1.alias(HASH_COLUMN), part.alias("_part")), "desired", {"desired": 1}
        ).drop(HASH_COLUMN, "_part")
    d = d.withColumns({"_k1": _key(k1), "_k2": _key(k2)}).alias("_d")
    shard_keys = stored.select(_key(k1).alias("_sk1"))
    seen = shard_keys.where(F.col("_sk1") == F.col("_d._k1").outer()).exists()  # an existence join
    cell = F.explode(F.when(F.col("_seen"), F.array(*_cells(F.col("_k2"), per_table))).otherwise(F.array(F.lit(-1))))
    whole = [*cols, *ROW_KEYS]
    grouped = (
        d.withColumn("_seen", seen)
        .select(*[F.col(spark_name(c)) for c in whole], "_k1", "_k2", "_diff", cell.alias("_cell"))
        .groupBy("_cell", *[F.when(F.col("_cell") < 0, F.col(spark_name(c))).alias(c) for c in whole])
        .agg(*_sums(F.col("_diff")))
    )
    label_jobs(spark, "reconcile: one scan, 2 (desired: new rows whole, the others into cells)")
    with checks.observing(spark) if checks is not None else nullcontext(), _broadcasting(spark):
        grouped = cached(grouped)  # planned here: the key halves broadcast
        d_cells = _collect_cells(grouped.where(F.col("_cell") >= 0))

    # 3. peel the difference of the cells
    try:
        changed = peel(d_cells, p_cells, per_table)
    except NotPeeled:
        if checks is not None:
            checks.rollback(mark)
        release()
        raise
    log.info(
        "one scan: %d changed shard key(s) peeled from %d+%d cell(s) in %.2f s",
        len(changed),
        len(d_cells),
        len(p_cells),
        perf_counter() - started,
    )
    label_jobs(spark, "reconcile: one scan, 3 (the shard's rows of the changed keys) and the staged write")

    # 4. the correction: new rows, and the shard's rows of the changed keys
    inserts = grouped.where((F.col("_cell") < 0) & (F.col("_n") != 0)).select(
        *[F.col(spark_name(c)) for c in whole], F.col("_n").alias("_diff")
    )
    sides = [inserts]
    if changed:
        keys = spark.createDataFrame(changed, "_ck1 BIGINT, _ck2 BIGINT, _cn BIGINT")
        rows = (
            stored.select(*keep, k1, k2)
            .join(F.broadcast(keys), (_key(k1) == F.col("_ck1")) & (_key(k2) == F.col("_ck2")))
            .dropDuplicates(["_ck1", "_ck2"])
        )
        sides.append(rows.select(*keep, k1, k2, F.col("_cn").alias("_diff")))
    both = sides[0] if len(sides) == 1 else sides[0].unionByName(sides[1])
    out = both.select(
        *keep,
        time.alias("_time"),
        F.col("_diff").cast("bigint").alias("_diff"),
        k1,
        k2,
        *([k1.alias(HASH_COLUMN)] if checks is not None else []),
        part.alias("_part"),
    )
    return out


@contextmanager
def _broadcasting(spark):
    """Let the planner broadcast the shard's key halves (8 bytes a row) for the existence join."""
    old = spark.conf.get(BROADCAST_CONF, None)
    spark.conf.set(BROADCAST_CONF, str(BROADCAST_BYTES))
    try:
        yield
    finally:
        if old is None:
            spark.conf.unset(BROADCAST_CONF)
        else:
            spark.conf.set(BROADCAST_CONF, old)


def _collect_cells(df: DataFrame) -> dict[int, tuple]:
    """The cells' sums of ``df`` (a frame with ``_cell``, ``_k1``, ``_k2``, ``_diff``, or one
    already summed per cell) as ``{cell: sums}``; only non-zero cells."""
    if "_n" not in df.columns:
        df = df.groupBy("_cell").agg(*_sums(F.col("_diff")))
    out = {}
    for r in df.collect():
        sums = tuple(int(r[s] or 0) for s in SUMS)
        if any(sums):
            out[int(r["_cell"])] = sums
    return out
