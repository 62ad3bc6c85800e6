"""The benchmarks' shared workload: data, the sinks that consume it, the contents check, the machine.

Query data. Rows of an orders-like schema (key ``id BIGINT NOT NULL`` and 14 typed columns:
bigints, ints, doubles, a decimal(12,2), a date, timestamps, a boolean, strings of 3 to 200
characters, some nullable columns holding nulls) are generated in Spark from hashes of (seed,
id, column). A change of a snapshot is ``changes`` rows split evenly among updates (four columns
of an existing id change), inserts (new ids) and deletes; the ids to update or delete are the
first ones in a seeded hash order.

Upsert data. A seeded command feed (key ``id``; values ``name``, ``amount``, ``qty``; ``ts``,
``off``, and ``op`` = 'd' for a delete): batch 0 loads every key once; a later batch holds
``count`` commands on keys drawn from ``[lo, lo + 1.1 * (keys - lo))`` (one command in eleven on a
new key), one in ten a delete. ``lo = 0`` spreads them over every key; ``lo = 0.95 * keys`` keeps
them on the most recent 5% of keys (key locality).

The check (:func:`compare`): every table's rows as a multiset against an expected frame that no
method computed, in one pass: each distinct row's multiplicity per table is counted beside its
multiplicity in the expected frame; ``only_in_table`` and ``only_expected`` are exactly what
``table.exceptAll(expected).count()`` and ``expected.exceptAll(table).count()`` return, and the
row counts are compared too. A shard enters with each row's consolidated count as its
multiplicity, so a count other than 1 is a difference.
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "include"))

import yaml  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

WIDTH = 1000  # ms per batch interval
AS_OF = 1_000_000
EPOCH_2020 = 1_577_836_800  # seconds

SCHEMA = [  # (name, type, nullable)
    ("id", "bigint", False),
    ("customer_id", "bigint", True),
    ("ext_ref", "bigint", True),
    ("qty", "int", False),
    ("region", "int", True),
    ("price", "double", True),
    ("discount", "double", True),
    ("amount", "decimal(12,2)", True),
    ("order_date", "date", True),
    ("created_at", "timestamp", True),
    ("updated_at", "timestamp", False),
    ("is_gift", "boolean", True),
    ("status", "string", False),
    ("customer", "string", True),
    ("note", "string", True),
]
COLUMNS = [c[0] for c in SCHEMA]
UPSERT_SCHEMA = [
    ("id", "bigint", False),
    ("name", "string", True),
    ("amount", "decimal(12,2)", True),
    ("qty", "int", True),
]
UPSERT_COLUMNS = [c[0] for c in UPSERT_SCHEMA]
STATUSES = ["new", "paid", "packed", "shipped", "delivered", "returned", "cancelled"]
FIRST = ["Ada", "Alan", "Barbara", "Claude", "Donald", "Edsger", "Frances", "Grace"]
FIRST += ["John", "Ken", "Leslie", "Margaret", "Niklaus", "Radia", "Shafi", "Tony"]
LAST = ["Hopper", "Lovelace", "Turing", "Liskov", "Shannon", "Knuth", "Dijkstra", "Allen"]
LAST += ["Backus", "Thompson", "Lamport", "Hamilton", "Wirth", "Perlman", "Goldwasser", "Hoare-Smith"]
LOREM = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt "


class Mismatch(Exception):
    """A method did not end with the expected contents."""


def timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def upper_of(batch: int) -> int:
    return AS_OF + (batch + 1) * WIDTH


# -- query data -----------------------------------------------------------------------------------


def hashed(seed: int, column: str, modulus: int, salt: str = "") -> F.Column:
    """A value in [0, modulus) from the hash of (seed, salt, column, id): deterministic per seed."""
    return F.pmod(F.xxhash64(F.lit(seed), F.lit(salt), F.lit(column), F.col("id")), F.lit(modulus))


def pick(values: list[str], index: F.Column) -> F.Column:
    return F.element_at(F.array(*[F.lit(v) for v in values]), (index + 1).cast("int"))


def generate(ids: DataFrame, seed: int) -> DataFrame:
    """Rows for the ids of ``ids`` (column ``id``), every value from a hash of (seed, id, column)."""
    h = lambda column, modulus: hashed(seed, column, modulus)  # noqa: E731
    created = F.lit(EPOCH_2020) + h("created_at", 5 * 365 * 86400)
    note_len = (h("note_len", 191) + 10).cast("int")
    note = F.concat(F.sha2(F.concat_ws(":", F.lit(seed), F.col("id")), 256), F.lit(" "), F.lit(LOREM * 2))
    return ids.select(
        F.col("id"),
        h("customer_id", 5_000_000).alias("customer_id"),
        h("ext_ref", 10**15).alias("ext_ref"),
        h("qty", 1000).cast("int").alias("qty"),
        F.when(h("region_null", 20) != 0, h("region", 50)).cast("int").alias("region"),
        (h("price", 10**7) / 100.0).alias("price"),
        F.when(h("discount_null", 10) != 0, h("discount", 1000) / 1000.0).alias("discount"),
        (h("amount", 10**8).cast("decimal(12,0)") / 100).cast("decimal(12,2)").alias("amount"),
        F.date_add(F.lit(date(2020, 1, 1)), h("order_date", 2000).cast("int")).alias("order_date"),
        F.when(h("created_null", 50) != 0, F.timestamp_seconds(created)).alias("created_at"),
        F.timestamp_seconds(created + h("updated_at", 30 * 86400)).alias("updated_at"),
        F.when(h("gift_null", 10) != 0, h("is_gift", 4) == 0).alias("is_gift"),
        pick(STATUSES, h("status", len(STATUSES))).alias("status"),
        F.concat_ws(" ", pick(FIRST, h("first", len(FIRST))), pick(LAST, h("last", len(LAST)))).alias("customer"),
        F.when(h("note_null", 5) != 0, note.substr(F.lit(1), note_len)).alias("note"),
    )


def update(rows: DataFrame, seed: int, salt: str) -> DataFrame:
    """The rows with qty, amount, status and updated_at changed (each is sure to differ)."""
    h = lambda column, modulus: hashed(seed, column, modulus, salt)  # noqa: E731
    status_index = F.array_position(F.array(*[F.lit(s) for s in STATUSES]), F.col("status")) - 1
    changed = {
        "qty": (F.col("qty") + 1 + h("qty", 9)).cast("int"),
        "amount": (F.col("amount") + (h("amount", 10_000) + 1).cast("decimal(12,0)") / 100).cast("decimal(12,2)"),
        "status": pick(STATUSES, F.pmod(status_index + 1 + h("status", len(STATUSES) - 1), F.lit(len(STATUSES)))),
        "updated_at": F.timestamp_seconds(F.unix_seconds("updated_at") + 1 + h("updated_at", 86400)),
    }
    return rows.select(*[changed.get(c, F.col(c)).alias(c) for c in COLUMNS])


def split(changes: int) -> tuple[int, int, int]:
    """(updates, inserts, deletes): ``changes`` split evenly, the remainder to updates, inserts."""
    base, rest = divmod(changes, 3)
    return base + (rest > 0), base + (rest > 1), base


def correction_size(changes: int) -> int:
    """Rows of the multiset difference of a change: an update retracts one row and adds one."""
    updates, inserts, deletes = split(changes)
    return 2 * updates + inserts + deletes


def change(spark: SparkSession, current: DataFrame, seed: int, salt: str, changes: int, next_id: int) -> DataFrame:
    """``current`` with ``changes`` changes: updates and deletes of the first ids in the hash order
    of (seed, salt, id), inserts of new ids from ``next_id`` on."""
    updates, inserts, deletes = split(changes)
    ranked = current.select("id", F.xxhash64(F.lit(seed), F.lit(salt), F.col("id")).alias("_h")).orderBy("_h", "id")
    touched, updated_ids = ranked.limit(updates + deletes).select("id"), ranked.limit(updates).select("id")
    updated = current.join(updated_ids, "id", "left_semi")
    return (
        current.join(touched, "id", "left_anti")
        .unionByName(update(updated, seed, salt))
        .unionByName(generate(spark.range(next_id, next_id + inserts), seed))
    )


# -- upsert data ----------------------------------------------------------------------------------


def commands(spark: SparkSession, keys: int, batch: int, count: int, seed: int, lo: int = 0) -> DataFrame:
    """Batch ``batch``'s commands (see the module doc), generated in Spark from hashes."""
    h = lambda salt: F.abs(F.xxhash64(F.lit(seed), F.lit(batch), F.lit(salt), F.col("id")))  # noqa: E731
    lower = AS_OF + batch * WIDTH
    if batch == 0:
        df = spark.range(keys).select(F.col("id").alias("k"), F.col("id"))
        op = F.lit("u")
    else:
        span = int((keys - lo) * 1.1)
        df = spark.range(count).select((F.lit(lo) + h("key") % span).alias("k"), F.col("id"))
        op = F.when(h("op") % 10 == 0, F.lit("d")).otherwise(F.lit("u"))
    return df.select(
        F.col("k").alias("id"),
        F.concat(F.lit("name-"), (h("name") % 100000).cast("string")).alias("name"),
        ((h("amount") % 1000000) / 100).cast("decimal(12,2)").alias("amount"),
        (h("qty") % 1000).cast("int").alias("qty"),
        (F.lit(lower) + h("ts") % WIDTH).alias("ts"),
        (F.lit(batch * 10_000_000) + F.col("id")).alias("off"),
        op.alias("op"),
    )


def latest_state(feed: DataFrame) -> DataFrame:
    """What a table kept by the whole feed holds: per key its last command (highest ts, off),
    unless that is a delete. The expectation of the upsert checks, computed from the feed
    alone (no batch, no MERGE)."""
    from pyspark.sql import Window

    last = Window.partitionBy("id").orderBy(F.desc("ts"), F.desc("off"))
    return feed.withColumn("_rn", F.row_number().over(last)).where("_rn = 1 AND op <> 'd'").select(*UPSERT_COLUMNS)


# -- the sinks ------------------------------------------------------------------------------------


def schema_yaml(schema) -> list[dict]:
    return [{"name": n, "type": t, "nullable": nullable} for n, t, nullable in schema]


def write_sink(root: Path, data: dict, partitions: int, retention: dict | None = None):
    """(Re)write a sink's YAML (``data`` + the benchmark's fixed fields) and load it."""
    from reconcile.config_loading import load_file

    data = {**data, "partitions": partitions, "start_date": "1970-01-01", "as_of": AS_OF, "schedule": "none"}
    if retention is not None:
        data["retention"] = retention
    path = root / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_file(path)


def query_sink(root: Path, name: str, desired: str, partitions: int, retention: dict | None = None):
    """A query sink ``SELECT * FROM desired`` over the Parquet snapshot at ``desired``."""
    query = {"sql": "SELECT * FROM desired", "sources": {"desired": {"format": "parquet", "path": desired}}}
    data = {"name": name, "kind": "query", "schema": schema_yaml(SCHEMA), "query": query}
    return write_sink(root, data, partitions, retention)


def upsert_sink(root: Path, name: str, feed: str, partitions: int):
    """An upsert sink over the command feed (Parquet) at ``feed``."""
    upsert = {
        "source": {"format": "parquet", "path": feed},
        "key": ["id"],
        "time_column": "ts",
        "offset_column": "off",
        "delete": {"column": "op", "values": ["d"]},
    }
    data = {"name": name, "kind": "upsert", "schema": schema_yaml(UPSERT_SCHEMA), "upsert": upsert}
    return write_sink(root, data, partitions)


def sink_batch(spark: SparkSession, ledger, cfg, batch: int) -> dict:
    """One batch of the sink (interval ``batch``): mint, write, append, each timed."""
    from reconcile.sink.run import run_batch

    r = run_batch(spark, ledger, cfg, f"b{batch}", upper_of(batch))
    w, a = r.write, r.append
    if w is None:
        raise RuntimeError(f"{cfg.name}: nothing minted: {r.mint.message}")
    if w.outcome != "staged" or a is None or a.outcome != "committed":
        raise RuntimeError(f"{cfg.name}: {r.message}")
    return {
        "mint_s": r.seconds["mint"],
        "write_s": r.seconds["write"],
        "append_s": r.seconds["append"],
        "sink_s": sum(r.seconds.values()),
        "updates": w.rows_ok + w.rows_err,
    }


def sink_contents(spark: SparkSession, ledger, cfg, batch: int) -> tuple[DataFrame, int]:
    """The sink's rows after ``batch`` (with their counts as :data:`WEIGHT`) and the number of
    updates in its log holding an error. Read as of the batch's upper - 1, or as of since if compaction
    moved since there (history_hours: 0)."""
    from reconcile.storage import frames
    from reconcile.storage.delta import ShardTable

    table = ShardTable(cfg)
    t = max(upper_of(batch) - 1, ledger.get_shard(cfg.name).since)
    ok, _ = frames.read_as_of(spark, table, t)
    errors = frames.read_updates(spark, table).where(F.col("_error").isNotNull()).count()
    return ok.withColumnRenamed("_count", WEIGHT), errors


# -- the check ------------------------------------------------------------------------------------


WEIGHT = "_w"  # a row's multiplicity in a table given to compare() (default 1: one row, one copy)


def compare(expected: DataFrame, tables: dict[str, DataFrame], columns: list[str]) -> dict[str, dict]:
    """Each table against ``expected`` as multisets of ``columns``, all in one pass (see the module
    doc): per table its row count, the rows only in it and the rows only expected. A table with a
    :data:`WEIGHT` column holds each row that many times (a shard's consolidated count)."""

    def weighted(df: DataFrame, tag: int) -> DataFrame:
        weight = F.col(WEIGHT) if WEIGHT in df.columns else F.lit(1)
        return df.select(*columns, F.lit(tag).alias("_t"), weight.cast("bigint").alias(WEIGHT))

    tagged = weighted(expected, 0)
    for i, df in enumerate(tables.values(), 1):
        tagged = tagged.unionByName(weighted(df, i))
    counts = [
        F.sum(F.when(F.col("_t") == i, F.col(WEIGHT)).otherwise(0)).alias(f"_c{i}") for i in range(len(tables) + 1)
    ]
    per_row = tagged.groupBy(*columns).agg(*counts)
    sums = []
    for i in range(1, len(tables) + 1):
        extra = F.col(f"_c{i}") - F.col("_c0")
        sums += [
            F.sum(F.col(f"_c{i}")).alias(f"n{i}"),
            F.sum(F.greatest(extra, F.lit(0))).alias(f"only{i}"),
            F.sum(F.greatest(-extra, F.lit(0))).alias(f"missing{i}"),
        ]
    got = per_row.agg(F.sum("_c0").alias("n0"), *sums).first()
    return {
        name: {
            "rows": int(got[f"n{i}"] or 0),
            "expected_rows": int(got["n0"] or 0),
            "only_in_table": int(got[f"only{i}"] or 0),
            "only_expected": int(got[f"missing{i}"] or 0),
        }
        for i, name in enumerate(tables, 1)
    }


def problems_of(result: dict[str, dict]) -> list[str]:
    """The differences :func:`compare` found, one line a table (empty: every table as expected)."""
    return [
        f"{name}: {r['rows']:,} rows ({r['expected_rows']:,} expected), {r['only_in_table']:,} only in it, "
        f"{r['only_expected']:,} missing"
        for name, r in result.items()
        if r["only_in_table"] or r["only_expected"] or r["rows"] != r["expected_rows"]
    ]


# -- a run --------------------------------------------------------------------------------------


def start(prefix: str, app: str, conf: dict[str, str] | None = None):
    """A benchmark's run: a temporary root (the warehouse inside it), the local session and a
    SQLite ledger in the root; and the session's start in seconds (reported apart)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ["RECONCILE_WAREHOUSE"] = str(root / "warehouse")
    from reconcile.spark import get_session
    from reconcile.storage.ledger import Ledger

    t0 = time.perf_counter()
    spark = get_session(app, conf)
    return root, spark, Ledger(f"sqlite:///{root / 'metadata.db'}"), time.perf_counter() - t0


def checked(work, root: Path, ledger):
    """``work()``'s result, or None when a check failed (said on stderr); the temporary files are
    kept when it did not finish."""
    try:
        return work()
    except Mismatch as exc:
        print(f"CONTENTS DIFFER: {exc}\n(temporary files kept in {root})", file=sys.stderr)
        return None
    except BaseException:
        print(f"(temporary files kept in {root})", file=sys.stderr)
        raise
    finally:
        ledger.dispose()


# -- the machine ----------------------------------------------------------------------------------


def machine(spark: SparkSession) -> dict:
    from importlib.metadata import version

    mem_kb = next(
        int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal:")
    )
    conf = spark.sparkContext.getConf()
    return {
        "cores": os.cpu_count(),
        "ram_gib": round(mem_kb / 2**20, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "spark": spark.version,
        "delta": version("delta-spark"),
        "master": spark.sparkContext.master,
        "driver_memory": conf.get("spark.driver.memory", None),
        "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
        "date": time.strftime("%Y-%m-%d"),
    }


def machine_line(m: dict) -> str:
    return (
        f"Machine: {m['cores']} cores, {m['ram_gib']} GiB RAM, {m['platform']}; Python {m['python']}, "
        f"Spark {m['spark']} ({m['master']}), Delta {m['delta']}; {m['date']}."
    )
