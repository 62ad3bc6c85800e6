"""Randomized proofs that a query batch taken from its sources' changes is exact (issue 48, 4).

Each case draws a query from :data:`SHAPES` (a Spark SQL template over sources ``a`` and ``b`` with
its plain-Python model), a kind for each source (a Delta table with its change data feed, or one
without a feed that grows by appends) and a sequence of steps between batches, each a few source
changes (inserts with duplicates, updates, deletes, an overwrite; several versions between two
batches) and now and then what the changes cannot say (a source's feed switched off for an
update, a VACUUM that removes the feed's files, an update of a source without a feed, a foreign
commit to the shard). After every batch the shard as of the batch's time equals the model over
the sources' rows, and the full comparison (the correction the write computes in full against the
shard, Spark's :func:`reconcile.sink.dry_run.spark_correction`) is empty: the shard is what a
full comparison would have written. A step with only changes the feeds carry must take the
changes (a linear shape), a step with a foreign commit must compare in full.

A new shape is one :class:`Shape` in :data:`SHAPES`: its SQL (columns ``k``, ``v``) and its model.
"""

from __future__ import annotations

import logging
import os
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from helpers import append_foreign_row, make_sink, run_job_killed_at, run_stages, shard_as_of
from reconcile.manifest import Manifest

Rows = list[tuple[int, int, str | None]]  # a source's rows: (k, g, v)


def _concat(*parts: str | None) -> str | None:
    return None if any(p is None for p in parts) else "".join(parts)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Shape:
    """A query over sources ``a`` (and ``b``) of columns ``k BIGINT, g BIGINT, v STRING``, giving
    ``k BIGINT, v STRING``, with its model: the output rows (as a Counter) of the sources' rows.
    Every batch whose changes the feeds carry is taken from them; ``linear``: projections,
    filters, UNION ALL (else the keys the changes touch are recomputed)."""

    name: str
    sql: str
    sources: tuple[str, ...]
    model: Callable[[dict[str, Rows]], Counter]
    linear: bool = True
    nullable: bool = False  # k nullable too (no row can be an error row: the shard holds the old rows)


def _grouped(rows: dict[str, Rows]) -> Counter:
    groups: dict[int, list[tuple[int, str | None]]] = {}
    for k, g, v in rows["a"]:
        if k % 5 != 0:
            groups.setdefault(g, []).append((k, v))
    out: Counter = Counter()
    for g, members in groups.items():
        if len(members) < 5:
            values = [v for _, v in members if v is not None]
            out[(g, f"{len(members)}:{sum(k for k, _ in members)}:{min(values) if values else '-'}")] += 1
    return out


def _group_max(rows: dict[str, Rows]) -> Counter:
    groups: dict[int, list[str]] = {}
    for k, g, v in rows["a"]:
        if k % 5 != 0:
            groups.setdefault(g, [])
            if v is not None:
                groups[g].append(v)
    return Counter((g, max(values) if values else None) for g, values in groups.items())


def _inner(rows: dict[str, Rows]) -> Counter:
    return Counter(
        (ka, _concat(va, "/", vb)) for ka, ga, va in rows["a"] if ka % 2 == 0 for _, gb, vb in rows["b"] if ga == gb
    )


def _left(rows: dict[str, Rows]) -> Counter:
    out: Counter = Counter()
    for ka, ga, _ in rows["a"]:
        matches = [vb for kb, gb, vb in rows["b"] if gb == ga and kb % 2 == 1]
        for vb in matches or [None]:
            out[(ka, vb if vb is not None else "none")] += 1
    return out


SHAPES = [
    Shape(
        "projection",
        "SELECT k, concat(v, '!') AS v FROM a",
        ("a",),
        lambda r: Counter((k, _concat(v, "!")) for k, _, v in r["a"]),
    ),
    Shape(
        "filter",
        "SELECT k, v FROM a WHERE g <> 1 AND k % 3 <> 0",
        ("a",),
        lambda r: Counter((k, v) for k, g, v in r["a"] if g != 1 and k % 3 != 0),
    ),
    Shape(
        "union_all",
        "SELECT k, v FROM a WHERE g < 2 UNION ALL SELECT k + 1000 AS k, upper(v) AS v FROM b",
        ("a", "b"),
        lambda r: Counter(
            [(k, v) for k, g, v in r["a"] if g < 2] + [(k + 1000, v and v.upper()) for k, _, v in r["b"]]
        ),
    ),
    Shape(
        "expressions",
        "SELECT k * 2 + g AS k, coalesce(substr(v, 1, 1), '-') AS v FROM a WHERE v IS NULL OR length(v) > 1",
        ("a",),
        lambda r: Counter(
            (k * 2 + g, v[:1] if v is not None else "-") for k, g, v in r["a"] if v is None or len(v) > 1
        ),
    ),
    # the shapes that recompute the keys their changes touch (kinds/incremental.py's keyed ones)
    Shape(
        "group_by",
        "SELECT g AS k, concat(cast(count(*) AS STRING), ':', cast(sum(k) AS STRING), ':', coalesce(min(v), '-')) "
        "AS v FROM a WHERE k % 5 <> 0 GROUP BY g HAVING count(*) < 5",
        ("a",),
        _grouped,
        linear=False,
    ),
    Shape(  # from the changes' partial aggregates (kinds/incremental_aggregate.py)
        "group_max",
        "SELECT g AS k, max(v) AS v FROM a WHERE k % 5 <> 0 GROUP BY g",
        ("a",),
        _group_max,
        linear=False,
        nullable=True,
    ),
    Shape(
        "inner_join",
        "SELECT a.k AS k, concat(a.v, '/', b.v) AS v FROM a JOIN b ON a.g = b.g WHERE a.k % 2 = 0",
        ("a", "b"),
        _inner,
        linear=False,
    ),
    Shape(
        "left_join",
        "SELECT a.k AS k, coalesce(b.v, 'none') AS v FROM a LEFT JOIN b ON a.g = b.g AND b.k % 2 = 1",
        ("a", "b"),
        _left,
        linear=False,
    ),
]


@dataclass
class Source:
    """A Delta source and its rows as the model sees them; ``feed``: its change data feed is on
    (else it is meant to grow by appends, whose added files are the change)."""

    spark: object
    path: str
    feed: bool
    rows: Rows = field(default_factory=list)

    def create(self) -> None:
        self.spark.sql(  # type: ignore[attr-defined]
            f"CREATE TABLE delta.`{self.path}` (k BIGINT, g BIGINT, v STRING) USING delta "
            f"TBLPROPERTIES (delta.enableChangeDataFeed = {'true' if self.feed else 'false'})"
        )

    def sql(self, text: str) -> None:
        self.spark.sql(text.format(t=f"delta.`{self.path}`"))  # type: ignore[attr-defined]

    def write(self, rows: Rows, mode: str = "append") -> None:
        df = self.spark.createDataFrame(rows, "k BIGINT, g BIGINT, v STRING")  # type: ignore[attr-defined]
        df.write.format("delta").mode(mode).save(self.path)


class Case:
    """One drawn case: a shape, its sources and the steps between batches (each step's changes
    are made on the sources and mirrored in their rows)."""

    def __init__(self, spark, root: str, seed: int, shape: Shape, feeds: bool | None = None) -> None:
        self.rng = random.Random(seed)
        self.shape, self.next_k = shape, 1
        on = {n: self.rng.random() < 0.7 if feeds is None else feeds for n in shape.sources}
        self.sources = {n: Source(spark, f"{root}/src_{n}", on[n]) for n in shape.sources}
        self.said: list[str] = []  # what each step did, for the failure's message
        for src in self.sources.values():
            src.create()

    def model(self) -> Counter:
        return Counter(
            {(*row, None): n for row, n in self.shape.model({n: s.rows for n, s in self.sources.items()}).items()}
        )

    def new_rows(self, src: Source, n: int) -> Rows:
        out: Rows = []
        for _ in range(n):
            if src.rows and self.rng.random() < 0.15:  # a duplicate of a row already there
                out.append(self.rng.choice(src.rows))
                continue
            v = None if self.rng.random() < 0.1 else self.rng.choice(["x", "yy", "zzz", "ab"])
            out.append((self.next_k, self.rng.randrange(4), v))
            self.next_k += 1
        return out

    def step(self, name: str, src: Source, kind: str) -> None:
        """One change of ``src`` (``kind``: insert, update, delete, overwrite, feed_off, vacuum)."""
        rng, spark = self.rng, src.spark
        if kind == "insert" or not src.rows:
            rows = self.new_rows(src, rng.randrange(1, 5))
            src.write(rows)
            src.rows += rows
            self.said.append(f"{name}: insert {rows}")
        elif kind in ("update", "feed_off"):
            k = rng.choice(src.rows)[0]
            if kind == "feed_off":
                src.sql("ALTER TABLE {t} SET TBLPROPERTIES (delta.enableChangeDataFeed = false)")
            src.sql(f"UPDATE {{t}} SET v = concat(coalesce(v, ''), 'u') WHERE k = {k}")
            if kind == "feed_off":
                src.sql("ALTER TABLE {t} SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")
            src.rows = [(kk, g, (v or "") + "u" if kk == k else v) for kk, g, v in src.rows]
            self.said.append(f"{name}: {kind} k={k}")
        elif kind == "delete":
            k = rng.choice(src.rows)[0]
            src.sql(f"DELETE FROM {{t}} WHERE k = {k}")
            src.rows = [r for r in src.rows if r[0] != k]
            self.said.append(f"{name}: delete k={k}")
        elif kind == "overwrite":
            kept = [r for r in src.rows if rng.random() < 0.5] + self.new_rows(src, 2)
            src.write(kept, "overwrite")
            src.rows = kept
            self.said.append(f"{name}: overwrite with {kept}")
        elif kind == "vacuum":  # the files of the feed (and the rows removed before) go
            spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")  # type: ignore[attr-defined]
            try:
                src.sql("VACUUM {t} RETAIN 0 HOURS")
            finally:
                spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")  # type: ignore[attr-defined]
            self.said.append(f"{name}: vacuum")

    def draw_step(self) -> tuple[list[str], bool]:
        """Make one step's changes; (the kinds made, whether every change is one the feeds carry)."""
        kinds, carried = [], True
        for _ in range(self.rng.randrange(0, 4)):
            name = self.rng.choice(sorted(self.sources))
            src = self.sources[name]
            if src.feed:
                kind = self.rng.choices(
                    ["insert", "update", "delete", "overwrite", "feed_off", "vacuum"], [4, 3, 2, 1, 0.4, 0.4]
                )[0]
            else:
                kind = self.rng.choices(["insert", "update", "delete"], [8, 0.7, 0.5])[0]
            if not src.rows and kind != "insert":
                kind = "insert"
            carried &= kind in ("insert", "update", "delete", "overwrite") and (src.feed or kind == "insert")
            self.step(name, src, kind)
            kinds.append(kind)
        return kinds, carried


def _way(ledger, cfg) -> str:
    from reconcile.report import status_data

    return status_data(ledger, cfg.name, limit=1)["batches"][-1]["refresh"]["text"]


def assert_full_comparison_agrees(spark, ledger, cfg, upper: int, where: str, last: bool) -> None:
    """The full comparison of the sources' query with the shard finds nothing to correct: DuckDB's
    (``dry-run``'s, no JVM) after every batch, and the write's own, in Spark, after the last one
    (or where DuckDB's might not be Spark's)."""
    from reconcile.sink import dry_run
    from reconcile.storage.delta import ShardTable

    duck = full_comparison(cfg, upper)
    assert duck in ((0, 0), None), f"DuckDB's full comparison differs: {where}"
    if last or duck is None:
        full = dry_run.spark_correction(spark, ledger, cfg, ShardTable(cfg), upper, upper + 1)
        assert (full.inserts, full.retractions) == (0, 0), f"Spark's full comparison differs: {where}"


def full_comparison(cfg, upper: int) -> tuple[int, int] | None:
    """(inserts, retractions) of DuckDB's full comparison of the query with the shard below
    ``upper`` (None: DuckDB's might not be Spark's, e.g. sources on an object store)."""
    from reconcile.sink import dry_run
    from reconcile.storage.delta import ShardTable

    try:
        duck = dry_run.correction(cfg, ShardTable(cfg), upper, upper + 1, limit=5)
    except dry_run.NotExact:
        return None
    return duck.inserts, duck.retractions


def run_case(
    spark, ledger, tmp_path, seed: int, shape: Shape, batches: int, root: str | None = None, feeds: bool | None = None
) -> Counter:
    """Draw and run one case (its sources under ``root``, default ``tmp_path``; ``feeds``: all
    with a change data feed, or none, else drawn); returns how many batches took each way."""
    case = Case(spark, root or str(tmp_path), seed, shape, feeds)
    sources = {n: {"format": "delta", "path": s.path} for n, s in case.sources.items()}
    schema = [{"name": "k", "type": "bigint", "nullable": shape.nullable}, {"name": "v", "type": "string"}]
    cfg = make_sink(tmp_path, f"rnd_{shape.name}", schema=schema, query={"sources": sources, "sql": shape.sql})
    for name, src in case.sources.items():
        case.step(name, src, "insert")
    history, ways, written = {}, Counter(), False
    for i in range(batches):
        upper = 200 + 100 * i
        foreign = i > 0 and case.rng.random() < 0.15
        kinds, carried = case.draw_step() if i > 0 else ([], False)
        if foreign:  # a commit to the shard behind the sink's back, inside the batch
            append_foreign_row(spark, cfg, upper - 100)
            case.said.append("the shard: a foreign commit")
        if i > 0 and case.model() != history[upper - 101]:  # the comparison sees the change to come
            seen = full_comparison(cfg, upper - 100)
            assert seen is None or sum(seen) > 0, f"seed {seed}, shape {shape.name}, batch {i}"
        run_stages(spark, ledger, cfg, f"r{i}", upper)
        way, want = _way(ledger, cfg), case.model()
        where = f"seed {seed}, shape {shape.name}, batch {i} ({way}); steps: {case.said}"
        assert shard_as_of(cfg, upper - 1) == want, where
        assert_full_comparison_agrees(spark, ledger, cfg, upper, where, last=i == batches - 1)
        if foreign:
            assert way.startswith("full comparison: the shard was written behind the sink's back"), where
        elif i > 0 and carried and written:  # only changes the feeds carry, to a shard that holds updates
            assert way.startswith("incremental ("), where
        written = written or foreign or bool(want)
        ways[way.split(" ")[0]] += 1
        history[upper - 1] = want
        case.said.append(f"batch {i}: {way}")
    for t, want in history.items():  # every batch's time still reads what it wrote
        assert shard_as_of(cfg, t) == want, f"as of {t}: seed {seed}, shape {shape.name}"
    return ways


# The suite's cases: two quick ones, and in the slow tier one of each other shape. More: every
# shape RECONCILE_RANDOM_ROUNDS times over (seeds from RECONCILE_RANDOM_SEED), e.g. 5 for a soak
# (all 7 shapes twice, five batches each, passed when written).
QUICK = [(0, "union_all"), (1, "group_by")]
ROUNDS = int(os.environ.get("RECONCILE_RANDOM_ROUNDS", "1"))
FIRST_SEED = int(os.environ.get("RECONCILE_RANDOM_SEED", "10"))
SLOW = [
    (FIRST_SEED + r * len(SHAPES) + i, shape.name)
    for r in range(ROUNDS)
    for i, shape in enumerate(SHAPES)
    if ROUNDS > 1 or shape.name not in {n for _, n in QUICK}
]


def _shape(name: str) -> Shape:
    return next(s for s in SHAPES if s.name == name)


@pytest.mark.parametrize("seed, shape", QUICK, ids=[f"{s}-{n}" for s, n in QUICK])
def test_random_batches_equal_the_model_and_the_full_comparison(
    spark, warehouse, tmp_path, sqlite_ledger, caplog, seed, shape
):
    with caplog.at_level(logging.INFO, logger="reconcile"):
        ways = run_case(spark, sqlite_ledger, tmp_path, seed, _shape(shape), batches=4)
    assert ways["incremental"] >= 1, ways  # the changes were taken, not only compared in full


@pytest.mark.slow  # one case of each shape the quick ones do not draw, four batches each
@pytest.mark.parametrize("seed, shape", SLOW, ids=[f"{s}-{n}" for s, n in SLOW])
def test_more_random_batches_equal_the_model_and_the_full_comparison(
    spark, warehouse, tmp_path, sqlite_ledger, seed, shape
):
    run_case(spark, sqlite_ledger, tmp_path, seed, _shape(shape), batches=4 if ROUNDS == 1 else 5)


@pytest.mark.slow  # an object store
def test_random_batches_on_s3_equal_the_model_and_the_full_comparison(spark, s3_warehouse, tmp_path, sqlite_ledger):
    """The same with the shard and the sources (their change data feeds) on S3."""
    ways = run_case(spark, sqlite_ledger, tmp_path, 5, _shape("union_all"), batches=2, root=s3_warehouse, feeds=True)
    assert ways["incremental"] >= 1, ways


# -- a batch from the changes killed at the write's and the append's fail points ------------------

CRASHES = [
    ("append", "append.after_delta_commit", "next_run"),
    ("write", "write.after_staged", "retry"),  # also passed: append.inside_delta_commit, retry
]


@pytest.mark.parametrize(
    "stage, point, recovery",
    [pytest.param(*c, marks=[pytest.mark.slow] if i else []) for i, c in enumerate(CRASHES)],
    ids=[f"{p}-{r}" for _, p, r in CRASHES],
)
def test_a_batch_from_the_changes_killed_then_recovered_is_exact(
    spark, warehouse, tmp_path, sqlite_ledger, monkeypatch, stage, point, recovery
):
    """A batch taken from its sources' changes, its process killed at a fail point (a write in a
    Spark JVM of its own, an append without one: tests/test_crash.py's harness), recovered as
    Airflow would (the task's retry, or the next run): the shard equals the model at every
    batch's time, check finds nothing, the full comparison nothing to correct, and the batch after
    is taken from the changes again."""
    from reconcile.sink import append, check, mint, write

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    shape = _shape("filter")
    case = Case(spark, str(tmp_path), 7, shape, feeds=True)
    sources = {n: {"format": "delta", "path": s.path} for n, s in case.sources.items()}
    name = f"crash_incr_{point.replace('.', '_')}"[:60]
    cfg = make_sink(tmp_path, name, query={"sources": sources, "sql": shape.sql})
    src = case.sources["a"]
    history = {}
    for i, kinds in enumerate([["insert"], ["insert", "update"]]):
        for kind in kinds:
            case.step("a", src, kind)
        run_stages(spark, sqlite_ledger, cfg, f"r{i}", 200 + 100 * i)
        history[199 + 100 * i] = case.model()

    for kind in ("update", "delete", "insert"):
        case.step("a", src, kind)
    desc = mint.run_mint(sqlite_ledger, cfg, "r2", 1, 400).description
    assert desc is not None
    if stage == "append":
        write.run_write(spark, sqlite_ledger, cfg, desc.batch_id)
    run_job_killed_at(stage, cfg, "r2", point, None)
    if recovery == "retry":
        if stage == "write":
            assert write.run_write(spark, sqlite_ledger, cfg, desc.batch_id).outcome == "already_staged"
        assert append.run_append(sqlite_ledger, cfg, desc.batch_id).outcome in ("committed", "recovered")
    history[399] = case.model()

    case.step("a", src, "update")
    run_stages(spark, sqlite_ledger, cfg, "r3", 500)
    history[499] = case.model()
    for t, want in history.items():
        assert shard_as_of(cfg, t) == want, f"as of {t}: {case.said}"
    assert check.violations(sqlite_ledger, cfg, spark=spark) == []
    assert full_comparison(cfg, 500) == (0, 0)
    ways = [Manifest.from_json(b.manifest).refresh_text() for b in sqlite_ledger.batches(cfg.name, ("committed",))]
    assert [(w or "").split(" ")[0] for w in ways] == ["full", "incremental", "incremental", "incremental"], ways
