"""Linear checksums of update frames, per hash partition: batches that verify themselves.

The checksum of a set of updates in hash partition ``p`` is

    sum over its updates u with partition(u) = p of  xxhash64(u's row columns, u._error) * u._diff   (mod 2^64)

with the same hash that places a row in its partition (:func:`reconcile.differential.partition_of`).
It is linear in the diffs, so the checksum of a collection as of ``t`` is the checksum of the
updates with ``_time <= t``, consolidated or not; and it does not look at ``_time``, so a
compaction that advances times leaves the checksum as of any ``t >= since`` as it was.

A batch's write records two of them per partition (``desired_checksum``, ``shard_checksum``):

- **desired**: what the kind says the shard must hold as of ``upper - 1``, from the frames the
  correction is computed from: a query's result; the change log below ``upper``; for an upsert
  sink the shard as read, with each touched key's value as of ``lower - 1`` (what the
  correction retracts) replaced by its last command's value, plus the commands that cannot be
  keyed;
- **shard**: the shard as of ``upper - 1`` once the batch is committed: persist as read (below
  ``upper``) plus the correction as staged.

Both are observed (``DataFrame.observe``) on the frames that flow into the staged write, so the
write's one Spark action computes them: no Spark job of their own. The shard as read is not
observed when the previous batch's record covers it (only the sink's own commits since it read
the table): its checksum as of ``lower - 1`` is the one that batch recorded, so a batch hashes
what it desires and what it writes, not the whole shard. Equal values say that the
correction, its consolidation, its partitioning and its staging lost and invented nothing; the
write fails the batch otherwise. ``check --verify`` recomputes the shard side from the Delta table
(:func:`reconcile.storage.frames.checksums_by_time`): a difference is corruption, a bug, or a
foreign edit at a time at or below the batch's ``upper - 1``.

A write sums the products as two limbs of the hash (its low 32 bits, unsigned, and the signed
high 32 bits) in BIGINTs, first with plain ``*`` and ``sum``: exact modulo 2^64 whatever the
values when arithmetic wraps (ANSI off), and under ANSI exact unless the job fails with an
overflow (a diff of 2^31 or more, or more than 2^31 units of ``|diff|`` in one partition and
frame), after which the write computes the batch again **guarded** (:func:`overflowed`):
``try_multiply`` and ``try_sum`` give null past those bounds, and such a partition's checksums
are not recorded (not verifiable), never wrong, and the write says so. A guarded observation
also notes whether a diff reaches 2^31 (a product that may not be exact: the whole frame is
then not verifiable); that aggregate is null for an empty frame (all sums null: checksum 0).
The guarded forms cost twice the plain ones (``bench/checksum_observation.py``).
``check --verify`` sums three limbs (22, 22 and 20 bits: exact up to about 2^41 units per time
and partition). Python adds the limbs up modulo 2^64; a checksum does not depend on the limbs
it was summed in.

Measured (1M rows, 4 partitions): the two-limb sums of the other partitions' rows as 0 (not
null) cost half of what three limbs with nulls did; the split by partition is most of the cost
(the same sums over all partitions at once cost next to nothing).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from reconcile.config import SinkConfig
from reconcile.differential import HASH_COLUMN, partition_of, partitioned_by, row_columns
from reconcile.errors import SinkError
from reconcile.sql_names import spark_name

# Batches observe, record and compare their checksums; bench/reconcile_bench.py --checksum-cost
# switches this off to measure what that costs. Batches written without them are not verifiable.
ENABLED = True
MOD = 1 << 64
# (shift, bits) of the hash's limbs; 0 bits: the signed rest. A write's observations (LIMBS) and
# check --verify's aggregation by time (WIDE_LIMBS).
LIMBS = ((0, 32), (32, 0))
WIDE_LIMBS = ((0, 22), (22, 22), (44, 0))
# A 32-bit limb times a diff of |diff| < EXACT fits a BIGINT; a frame holding a larger diff is not
# verifiable (its products are not all exact).
EXACT = 1 << 31
SIDES = ("desired", "shard")
# Spark's adaptive execution drops a finished stage whose output is empty from the final plan,
# and with it the observations it made (the metrics of an all-empty batch would be missing).
KEEP_EMPTY_STAGES = "org.apache.spark.sql.execution.adaptive.AQEPropagateEmptyRelation"
EXCLUDED_RULES = "spark.sql.adaptive.optimizer.excludedRules"


class SelfCheckFailed(SinkError):
    """A batch does not add up: in some hash partition the checksum of what the kind says the
    shard must hold differs from the shard's after the correction (a bug; nothing is staged)."""

    remedy = (
        "nothing was staged or committed; report it with the batch id (a bug in the sink or in Spark). "
        "Rerunning the write recomputes the batch; `python -m reconcile check SINK --verify` checks the "
        "committed ones."
    )


def row_hash(cfg: SinkConfig) -> Column:
    """``xxhash64(row columns, _error)``: the hash :func:`reconcile.differential.partition_of` uses."""
    return F.xxhash64(*[F.col(spark_name(c)) for c in row_columns(cfg)])


def raw_limbs(h: Column, spec: Sequence[tuple[int, int]] = LIMBS) -> list[Column]:
    """The limbs of ``h`` (BIGINT columns)."""
    out = []
    for shift, bits in spec:
        limb = F.shiftright(h, shift) if shift else h
        out.append(limb.bitwiseAND(F.lit((1 << bits) - 1)) if bits else limb)
    return out


def limbs(h: Column, diff: Column, spec: Sequence[tuple[int, int]] = LIMBS) -> list[Column]:
    """``h * diff`` as one BIGINT column per limb of ``h``: sum each, then :func:`combine`."""
    return [limb * diff for limb in raw_limbs(h, spec)]


def combine(sums: Sequence[int | None], spec: Sequence[tuple[int, int]] = LIMBS) -> int:
    """The checksum (``0 <= x < 2^64``) from the sums of :func:`limbs`' columns (None: no rows)."""
    return sum(int(s or 0) << shift for s, (shift, _) in zip(sums, spec, strict=True)) % MOD


def text(value: int) -> str:
    """How manifests and commits record a checksum: 16 hex digits."""
    return f"{value % MOD:016x}"


@contextmanager
def observable(spark: SparkSession) -> Iterator[None]:
    """Keep every stage of the next Spark action in its final plan, so that each observation
    reports (even of an empty batch); the session's setting is restored afterwards."""
    old = spark.conf.get(EXCLUDED_RULES, None) or ""
    rules = [r for r in old.split(",") if r.strip()]
    if KEEP_EMPTY_STAGES not in rules:
        spark.conf.set(EXCLUDED_RULES, ",".join([*rules, KEEP_EMPTY_STAGES]))
    try:
        yield
    finally:
        if old:
            spark.conf.set(EXCLUDED_RULES, old)
        else:
            spark.conf.unset(EXCLUDED_RULES)


def overflowed(exc: BaseException | None) -> bool:
    """Did a Spark action fail on an arithmetic overflow (ANSI), as a plain checksum sum can? The
    chain of exceptions is searched: PySpark can fail while converting Spark's error (logging its
    query context) and raise that failure instead, with Spark's error as its context."""
    seen = 0
    while exc is not None and seen < 10:
        if "ARITHMETIC_OVERFLOW" in str(exc):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class BatchChecks:
    """The observations of one write attempt: :meth:`observe` the frames a correction is computed
    from, add the correction's aggregates to the staged write's own observation
    (:meth:`aggregates`), run the write, then :meth:`totals`.

    Observe only frames that every execution consumes in full: a union's inputs, the written
    frame; never a join's input (a join may stop reading one side when the other is empty).

    ``carried``: the shard's checksums as of ``lower - 1`` as the previous batch recorded them
    (:func:`reconcile.sink.write.carried_checksums`), when nothing but the sink's own commits
    changed the table since that batch read it: the shard's side then starts from them instead of
    observing the whole shard as read (the write's costliest observation); the kinds that read
    the whole shard skip that observation.
    """

    def __init__(
        self,
        cfg: SinkConfig,
        lower: int,
        upper: int,
        tag: str,
        carried: dict[int, int] | None = None,
        guarded: bool = False,
    ):
        self.cfg, self.lower, self.upper, self.tag = cfg, lower, upper, tag
        self.carried = carried
        self.guarded = guarded  # try_* sums (after a plain attempt overflowed)
        self._observed: list[tuple[str, Any, dict[str, int]]] = []
        self.correction_into: dict[str, int] = {"shard": 1}  # the staged correction's sides

    def aggregates(
        self, df: DataFrame, role: str, where: Column | None = None
    ) -> tuple[DataFrame, list[Column], list[str]]:
        """(``df`` with the row hash and its partition added, :meth:`hashed_aggregates` over them,
        the added columns' names to drop after the observation): for a frame that does not carry
        the hash; the observation the caller makes must then be passed to :meth:`attach`."""
        by_row = partitioned_by(self.cfg) is None
        part = F.pmod(F.col(HASH_COLUMN), F.lit(self.cfg.partitions)).cast("int") if by_row else partition_of(self.cfg)
        hashed = df.withColumn(HASH_COLUMN, row_hash(self.cfg)).withColumn("_ck_p", part)
        return hashed, self.hashed_aggregates(role, "_ck_p", where), [HASH_COLUMN, "_ck_p"]

    def hashed_aggregates(self, role: str, part: str = "_part", where: Column | None = None) -> list[Column]:
        """The aggregates of a frame that carries the row hash (``HASH_COLUMN``) and its partition
        (``part``), of the rows matching ``where``: no column is added around the observation
        (each added column would copy every row once more between Spark's generated stages)."""
        if where is None:  # as Spark SQL: one parse an aggregate, not a call to the JVM per node
            return self._hashed_sql(role, part)
        h = F.col(HASH_COLUMN)
        diff = F.when(where, F.col("_diff")).otherwise(0)
        total, times = (F.try_sum, F.try_multiply) if self.guarded else (F.sum, lambda a, b: a * b)
        sums = [
            total(F.when(F.col(part) == p, times(limb, diff)).otherwise(0)).alias(f"{role}_l{i}_{p}")
            for p in range(self.cfg.partitions)
            for i, limb in enumerate(raw_limbs(h))
        ]
        if not self.guarded:
            return sums
        return [F.max((diff >= F.lit(EXACT)) | (diff <= F.lit(-EXACT))).alias(f"{role}_wide"), *sums]

    def _hashed_sql(self, role: str, part: str) -> list[Column]:
        """:meth:`hashed_aggregates` of every row, each aggregate written in Spark SQL."""
        h, diff = f"`{HASH_COLUMN}`", "`_diff`"
        limbs_ = []
        for shift, bits in LIMBS:
            limb = f"shiftright({h}, {shift})" if shift else h
            limbs_.append(f"({limb} & {(1 << bits) - 1})" if bits else limb)
        total, times = ("try_sum", "try_multiply({}, {})") if self.guarded else ("sum", "{} * {}")
        sums = [
            F.expr(f"{total}(CASE WHEN `{part}` = {p} THEN {times.format(limb, diff)} ELSE 0 END) AS `{role}_l{i}_{p}`")
            for p in range(self.cfg.partitions)
            for i, limb in enumerate(limbs_)
        ]
        if not self.guarded:
            return sums
        wide = F.expr(f"max(({diff} >= {EXACT}) OR ({diff} <= {-EXACT})) AS `{role}_wide`")
        return [wide, *sums]

    def observe_hashed(self, df: DataFrame, role: str, into: dict[str, int]) -> DataFrame:
        """:meth:`observe` for a frame that carries ``HASH_COLUMN`` and ``_part``."""
        from pyspark.sql import Observation

        observation = Observation(f"checksum-{role}-{self.tag}")
        self.attach(observation, role, into)
        return df.observe(observation, *self.hashed_aggregates(role))

    def attach(self, observation: Any, role: str, into: dict[str, int]) -> None:
        """Count ``role``'s aggregates of ``observation`` ``into[side]`` times into each side."""
        self._observed.append((role, observation, into))

    def carry(self, into: dict[str, int]) -> None:
        """Count the carried checksums (the shard as of ``lower - 1``) ``into[side]`` times into each
        side, instead of observing the shard as read."""
        assert self.carried is not None, "nothing to carry"
        self._observed.append(("carried", None, into))

    def observe(self, df: DataFrame, role: str, into: dict[str, int], where: Column | None = None) -> DataFrame:
        """``df`` (an update frame), observed: its checksum per partition (of the rows matching
        ``where``) counts ``into[side]`` times into each side (``desired``, ``shard``)."""
        from pyspark.sql import Observation  # Spark Connect's in a Connect process

        observation = Observation(f"checksum-{role}-{self.tag}")
        hashed, aggregates, tmp = self.aggregates(df, role, where)
        self.attach(observation, role, into)
        return hashed.observe(observation, *aggregates).drop(*tmp)

    def count_correction_into(self, side: str) -> None:
        """Count the staged correction's observation into ``side`` too (a correction staged as the
        desired side comes: :func:`reconcile.differential.difference` without consolidating)."""
        self.correction_into[side] = 1

    def mark(self) -> int:
        """A point to :meth:`rollback` to: the observations made so far."""
        return len(self._observed)

    def rollback(self, mark: int) -> None:
        """Forget the observations made since ``mark`` (a correction abandoned for another way of
        computing it, whose frames make their own)."""
        del self._observed[mark:]

    def observing(self, spark: SparkSession):
        """:func:`observable` for an action of the correction's own (before the staged write's)
        that makes some of these observations."""
        return observable(spark)

    def totals(self) -> dict[str, dict[int, int | None]]:
        """Per side, per partition: the checksum (after the write's action ran); None where a
        frame held more than the limbs can sum exactly (not verifiable)."""
        out: dict[str, dict[int, int | None]] = {side: dict.fromkeys(range(self.cfg.partitions), 0) for side in SIDES}
        for role, observation, into in self._observed:
            if observation is None:  # carried from the previous batch
                values: dict[int, int | None] = {p: (self.carried or {}).get(p, 0) for p in range(self.cfg.partitions)}
            else:
                try:
                    got = observation.get
                except Exception:  # noqa: BLE001 - the metrics never arrived (classic Spark asserts)
                    got = {}
                values = {p: self._observed_value(got, role, p) for p in range(self.cfg.partitions)}
            for p, value in values.items():
                for side, times in into.items():
                    now = out[side][p]
                    out[side][p] = None if now is None or value is None else (now + times * value) % MOD
        return out

    def _observed_value(self, got: dict, role: str, p: int) -> int | None:
        """One partition's checksum from ``role``'s observed aggregates: 0 for an empty frame
        (``_wide`` null: no row), None if a product or a sum was not exact (a diff of 2^31 or
        more in the frame, or more than 2^31 units of |diff| in the partition)."""
        keys = ([f"{role}_wide"] if self.guarded else []) + [f"{role}_l{i}_{p}" for i in range(len(LIMBS))]
        if any(k not in got for k in keys):
            raise SelfCheckFailed(
                f"the checksums of the batch's {role} frame were not observed by Spark; nothing was staged",
                sink=self.cfg.name,
            )
        if not self.guarded:  # plain sums: exact modulo 2^64, or the action failed
            return combine([got[k] for k in keys])
        wide, sums = got[keys[0]], [got[k] for k in keys[1:]]
        if wide is None:
            return 0
        if wide or any(s is None for s in sums):
            return None
        return combine(sums)
