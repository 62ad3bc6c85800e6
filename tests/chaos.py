"""Randomized schedules: source changes, runs, reruns, tampering, crashes, races, read-only,
compactions (alone, crashing, or racing a run).

A seeded generator drives one query sink (``--kind upsert``: one upsert sink, see below) through
a random sequence of steps and checks, after every step, against an independent model (the
source rows each committed batch was computed from, counted with plain Python):

- the shard as of the last committed ``upper - 1`` equals that batch's source (drift included:
  a batch repairs whatever was tampered before it);
- as of every earlier committed ``upper - 1``, the shard equals that batch's source, for the
  batches committed after the last tampering (tampering rewrites history, by design) and at or
  after the shard's ``since`` (compaction consolidates the history before it);
- the ledger agrees with the Delta log, lowers strictly increase and chain, no lower is
  committed twice (:mod:`reconcile.check`).

Upsert mode (``kind="upsert"``): the source is a command feed ``(k, v, ts, off)`` kept as an
append-only log: new commands (new, higher offsets), replays of old ones (same offset), deletes
(``v`` null), commands at the (key, time) of an earlier one, late commands (a time below the
shard's upper, a new offset). Each staged batch keeps the feed its write read; the model
(:class:`upsert_model.UpsertModel`, built afresh at every check) replays the committed batches in
order over those feeds, and the shard's valid rows as of each committed ``upper - 1`` must equal
its state (the same exceptions for tampering and compaction); each batch's recorded watermark
(``source_offset``) and late commands must be the model's. Tampering is a foreign writer
(delta-spark or delta-rs) deleting a key, adding a key the feed never had, changing a value or
duplicating a row: the first batch whose write read it repairs every key it touched, so the upsert
invariants (:mod:`reconcile.check`, point 5) are waived only until such a batch commits. A batch
staged before the tampering and committed after it (a crashed run's, rerun: its staged files are
kept as they are) did not read it: its history is not compared, as for batches before it.

Crashes here are in-process (fail points armed to raise) so that thousands of steps stay cheap;
killed processes are covered by tests/test_crash.py. Races are 2-3 threads running different
runs of the sink at once against the same ledger and Delta table; zombies are 2-3
threads running attempts of the *same* run (the same batch) at once.

    python tests/chaos.py --schedules 1000 --seed 1        # prints counts and divergences
    python tests/chaos.py --schedules 1 --seed 1 --first 417  # reproduce schedule 417
    python tests/chaos.py --schedules 10 --s3               # the warehouse on S3 (harness/s3_server.py)
    python tests/chaos.py --schedules 100 --kind upsert     # an upsert sink and its command feed
    python tests/chaos.py --schedules 100 --current         # keeping a current-state table too

With ``--s3`` the script starts its own S3 server (versitygw on 127.0.0.1) and puts the
warehouse on it (``s3://<bucket>/chaos-<seed>-<first>``): the standard AWS variables are set
before its JVM starts, as a deployment's are, so S3A, delta-rs and Arrow all read them. Only the
sources stay on the local disk.

A test harness (it tampers with tables and points RECONCILE_WAREHOUSE elsewhere): it lives under
tests/, outside the installed package. ``scripts/chaos_soak.sh`` runs it in resumable chunks.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from reconcile import failpoints, kinds, settings
from reconcile.config import SinkConfig
from reconcile.config_loading import load_file
from reconcile.errors import SinkError
from reconcile.model import COMMITTED
from reconcile.sink import check, compact
from reconcile.sink import run as pipeline
from reconcile.sink.sync import sync
from reconcile.spark import get_session
from reconcile.storage import frames
from reconcile.storage.current import CurrentTable
from reconcile.storage.delta import ShardTable
from reconcile.storage.ledger import Ledger
from tiny_spark import TINY_DATA_CONF
from upsert_model import HINT, UPSERT, UpsertModel

log = logging.getLogger(__name__)
KEYS = range(6)
COMPACT_POINTS = tuple(p for p in failpoints.POINTS if p.startswith("compact."))
# The current-state table's points fire only for a sink that keeps one (``current=True``): a
# crash picks one of them instead, from a generator of its own (the seeded schedules stay as they were).
CURRENT_POINTS = tuple(p for p in failpoints.POINTS if p.startswith("current."))
BATCH_POINTS = tuple(p for p in failpoints.POINTS if p not in COMPACT_POINTS and p not in CURRENT_POINTS)
VALUES = "abc"
KINDS = ("query", "upsert")


@dataclass
class Stats:
    schedules: int = 0
    steps: int = 0
    runs: int = 0
    crashes: int = 0
    races: int = 0
    tampers: int = 0
    read_only_toggles: int = 0
    compactions: int = 0
    zombies: int = 0
    divergences: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"schedules={self.schedules} steps={self.steps} runs={self.runs} crashes={self.crashes} "
            f"races={self.races} tampers={self.tampers} read_only_toggles={self.read_only_toggles} "
            f"compactions={self.compactions} zombies={self.zombies} "
            f"divergences={len(self.divergences)}"
        )


class Schedule:
    """One sink, one seeded sequence of steps."""

    def __init__(
        self,
        spark,
        ledger: Ledger,
        root: Path,
        seed: int,
        index: int,
        stats: Stats,
        kind: str = "query",
        current: bool = False,
    ):
        assert kind in KINDS, kind
        self.spark, self.ledger, self.stats, self.kind, self.current = spark, ledger, stats, kind, current
        self.rng = random.Random(f"{seed}:{index}")
        self.current_rng = random.Random(f"{seed}:{index}:current")
        self.tag = f"seed={seed} schedule={index}" + ("" if kind == "query" else f" kind={kind}")
        self.dir = root / f"s{index}"
        self.dir.mkdir(parents=True)
        name = f"chaos_{seed}_{index}" if kind == "query" else f"chaos_{kind}_{seed}_{index}"
        spec = {
            "name": name,
            "kind": kind,
            "partitions": self.rng.choice([1, 2, 3]),
            "schema": [{"name": "k", "type": "bigint", "nullable": False}, {"name": "v", "type": "string"}],
            "start_date": "1970-01-01",
            "as_of": 1000,
            "retention": {"history_hours": 0},
        }
        if current:
            spec["current"] = {"deletion_vectors": True}  # the sink's own vector commits: the intricate path
        if kind == "query":
            spec["query"] = {"sources": {"src": {"format": "json", "path": "src"}}, "sql": "SELECT k, v FROM src"}
        else:
            spec["upsert"] = dict(UPSERT)
        (self.dir / f"{name}.yaml").write_text(yaml.safe_dump(spec))
        self.cfg: SinkConfig = load_file(self.dir / f"{name}.yaml")
        self.rows: list[dict] = []
        # upsert: the command feed, append-only (a log), and the last offset given out
        self.feed: list[dict] = []
        self.offset = 0
        # batch id -> what its write read: query, the model of the source; upsert, the feed's commands
        self.source_of: dict[str, Counter | tuple[dict, ...]] = {}
        self.stages_seen: set[str] = set()
        self.frontier = 1000
        self.run_no = 0
        self.past_runs: list[tuple[str, int]] = []
        self.tampered_below = 0  # history before this upper may differ (tampered)
        # upsert: the write attempts staged before the last tampering (they did not read it)
        self.staged_before_tamper: set[str] = set()
        self.lock = threading.Lock()
        if kind == "query":
            self.set_source([{"k": k, "v": self.rng.choice(VALUES)} for k in KEYS if self.rng.random() < 0.6])
        else:
            as_of = self.cfg.as_of
            for _ in range(self.rng.randint(0, 5)):
                self.feed.append(self.command(self.rng.choice(KEYS), self.rng.randint(as_of - 50, as_of + 400)))
            self.write_feed()

    # -- the model --------------------------------------------------------------------------

    def set_source(self, rows: list[dict]) -> None:
        self.rows = rows
        src = self.dir / "src"
        src.mkdir(exist_ok=True)
        with open(src / "part-0.json", "w") as f:
            f.write(json.dumps({"k": 0, "v": "_schema"}) + "\n" if not rows else "")
            for r in rows:
                f.write(json.dumps(r) + "\n")
        if not rows:  # keep a schema: one row we never count (filtered below)
            self.rows = [{"k": 0, "v": "_schema"}]

    def model(self) -> Counter:
        return Counter((r["k"], r["v"], None) for r in self.rows)

    def snapshot(self) -> Counter | tuple[dict, ...]:
        """What a run about to start reads: the source's model, or the feed's commands."""
        return self.model() if self.kind == "query" else tuple(self.feed)

    # -- the upsert feed --------------------------------------------------------------------

    def command(self, k: int, ts: int) -> dict:
        """A new command (the next offset): a value, or a delete (a null value)."""
        self.offset += self.rng.choice([1, 1, 2])
        v = None if self.rng.random() < 0.2 else self.rng.choice(VALUES)
        return {"k": k, "v": v, "ts": ts, "off": self.offset}

    def write_feed(self) -> None:
        """The feed file, in log order, with a schema-only hint row that is never eligible."""
        src = self.dir / "feed"
        src.mkdir(exist_ok=True)
        with open(src / "part-0.json", "w") as f:
            for c in [*self.feed, HINT]:
                f.write(json.dumps(c) + "\n")

    def committed_upper(self) -> int:
        committed = self.ledger.batches(self.cfg.name, (COMMITTED,))
        return max((b.upper for b in committed), default=self.cfg.as_of)

    def change_feed(self) -> None:
        """Append 1-4 entries to the feed: new commands waiting at or after the shard's upper,
        late ones (a time below it), ones at an earlier command's (key, time), or replays of an
        earlier command (its offset). Nothing is rewritten or removed."""
        as_of, upper = self.cfg.as_of, self.committed_upper()
        for _ in range(self.rng.randint(1, 4)):
            r = self.rng.random()
            if r < 0.15 and self.feed:  # a replay: the same command, the same offset
                self.feed.append(dict(self.rng.choice(self.feed)))
            elif r < 0.3 and self.feed:  # the (key, time) of an earlier command, a higher offset
                c = self.rng.choice(self.feed)
                self.feed.append(self.command(c["k"], c["ts"]))
            elif r < 0.5 and upper > as_of:  # late: below the shard's upper
                self.feed.append(self.command(self.rng.choice(KEYS), self.rng.randint(as_of - 50, upper - 1)))
            else:
                ts = self.rng.randint(upper, max(upper, self.frontier) + 400)
                self.feed.append(self.command(self.rng.choice(KEYS), ts))
        self.write_feed()

    # -- operations -------------------------------------------------------------------------

    def one_run(self, run_id: str, frontier: int, crash: str | None = None, attempt: int = 1) -> None:
        snapshot = self.snapshot()
        if crash:
            failpoints.arm(crash, "raise@1")
        try:
            pipeline.run_batch(self.spark, self.ledger, self.cfg, run_id, frontier, attempt=attempt)
        except SinkError as exc:  # expected: crashes, lost races, superseded descriptions
            log.info("%s run %s ended with %s", self.tag, run_id, type(exc).__name__)
        finally:
            if crash:
                failpoints.disarm_all()
            self.note_staged(run_id, snapshot)

    def note_staged(self, run_id: str, snapshot: Counter | tuple[dict, ...]) -> None:
        """The model of each batch this run staged: the source the winning write attempt read
        (upsert: the feed's commands). A staging attempt not seen before was made by this call
        (or by a zombie thread of the same step, which read the same source); one seen before
        keeps the source it had."""
        with self.lock:
            for b in self.ledger.batches(self.cfg.name):
                if b.run_id == run_id and b.stage_id and b.stage_id not in self.stages_seen:
                    self.stages_seen.add(b.stage_id)
                    self.source_of[b.batch_id] = snapshot

    def next_run(self) -> tuple[str, int]:
        self.run_no += 1
        self.frontier += self.rng.choice([100, 200, 300])
        run = (f"run-{self.run_no}", self.frontier)
        self.past_runs.append(run)
        return run

    def step(self) -> None:
        op = self.rng.choices(
            ["change", "run", "crash", "race", "zombie", "tamper", "read_only", "rerun", "compact"],
            weights=[3, 4, 2, 1, 2, 1, 1, 1, 1],
        )[0]
        self.stats.steps += 1
        if op == "change" and self.kind == "upsert":
            self.change_feed()
        elif op == "change":
            rows = [dict(r) for r in self.rows if r["v"] != "_schema" and self.rng.random() < 0.7]
            for _ in range(self.rng.randint(0, 3)):
                rows.append({"k": self.rng.choice(KEYS), "v": self.rng.choice(VALUES)})
            self.set_source(rows)
        elif op == "run":
            self.stats.runs += 1
            self.one_run(*self.next_run())
        elif op == "crash":
            self.stats.runs += 1
            self.stats.crashes += 1
            run_id, frontier = self.next_run()
            crash = self.rng.choice(BATCH_POINTS)
            if self.current and self.current_rng.random() < 0.4:
                crash = self.current_rng.choice(CURRENT_POINTS)
            self.one_run(run_id, frontier, crash=crash)
            recovery = self.rng.choice(["retry", "rerun", "next_run"])
            if recovery in ("retry", "rerun"):
                self.one_run(run_id, frontier)
        elif op == "race":
            self.stats.races += 1
            runs = [self.next_run() for _ in range(self.rng.choice([2, 3]))]
            if self.rng.random() < 0.5:  # the same frontier: a manual run overlapping a scheduled one
                runs = [(r, runs[0][1]) for r, _ in runs]
            self.stats.runs += len(runs)
            threads = [threading.Thread(target=self.one_run, args=r) for r in runs]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        elif op == "zombie":  # attempts of the *same* run at once: a zombie task and its retry(s)
            self.stats.races += 1
            self.stats.zombies += 1
            run = self.next_run() if self.rng.random() < 0.7 or not self.past_runs else self.rng.choice(self.past_runs)
            n = self.rng.choice([2, 3])
            self.stats.runs += n
            threads = [threading.Thread(target=self.one_run, args=run, kwargs={"attempt": a + 1}) for a in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        elif op == "tamper" and self.kind == "upsert":
            if self.tamper_upsert():  # counted when the shard had a batch to tamper with
                self.stats.tampers += 1
        elif op == "tamper":
            self.stats.tampers += 1
            self.tamper()
        elif op == "read_only":
            self.stats.read_only_toggles += 1
            self.ledger.ensure_shard(self.cfg.name, self.cfg.as_of)
            shard = self.ledger.get_shard(self.cfg.name)
            self.ledger.set_read_only(self.cfg.name, not shard.read_only)
        elif op == "rerun" and self.past_runs:
            self.stats.runs += 1
            self.one_run(*self.rng.choice(self.past_runs))
        elif op == "compact":
            self.stats.compactions += 1
            crash = self.rng.choice(COMPACT_POINTS) if self.rng.random() < 0.3 else None
            if self.rng.random() < 0.5:  # racing a run
                self.stats.races += 1
                self.stats.runs += 1
                t = threading.Thread(target=self.one_run, args=self.next_run())
                t.start()
                self.compact(crash)
                t.join()
            else:
                self.compact(crash)

    def compact(self, crash: str | None) -> None:
        if crash:
            self.stats.crashes += 1
            failpoints.arm(crash, "raise@1")
        try:
            compact.run_compact(self.spark, self.ledger, self.cfg, vacuum_files=False)
        except SinkError as exc:  # an armed fail point, a since that cannot move yet
            log.info("%s compaction ended with %s", self.tag, type(exc).__name__)
        finally:
            if crash:
                failpoints.disarm_all()

    def tamper(self) -> None:
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        if not ShardTable(self.cfg).exists():
            return
        path = ShardTable(self.cfg).path
        choice = self.rng.choice(["delete", "duplicate", "insert"])
        k = self.rng.choice(KEYS)
        if choice == "delete":
            DeltaTable.forPath(self.spark, path).delete(F.col("k") == k)
        else:
            df = frames.read_updates(self.spark, ShardTable(self.cfg))
            if choice == "duplicate":
                df = df.where(F.col("k") == k).limit(1)
            else:
                df = df.limit(1).withColumn("k", F.lit(100 + k).cast("bigint")).withColumn("v", F.lit("foreign"))
            df.write.format("delta").mode("append").save(path)
        self.tampered_below = self.ledger.get_shard(self.cfg.name).upper

    def tamper_upsert(self) -> bool:
        """A foreign writer on the upsert shard (delta-spark or delta-rs): delete every row of a
        key, add a key the feed never had, change a key's value (a -1 of its row, a +1 of another
        value), or duplicate a row. Rows go in at a time below the shard's upper. False: no batch
        committed yet, nothing done."""
        from deltalake import DeltaTable as RsTable
        from deltalake import write_deltalake

        table = ShardTable(self.cfg)
        upper = self.committed_upper()
        if not table.exists() or upper <= self.cfg.as_of:
            return False
        path, options = table.path, settings.delta_storage_options()
        log_rows = RsTable(path, storage_options=options).to_pyarrow_table().to_pylist()
        state = sorted(k for k in self.as_of(log_rows, upper - 1) if k[2] is None)  # (k, v, None)
        choice = self.rng.choice(["delete", "delete_rs", "foreign_key", "change", "duplicate"])
        t = self.rng.randint(max(self.cfg.as_of, upper - 300), upper - 1)
        if choice in ("change", "duplicate", "delete", "delete_rs") and not state:
            choice = "foreign_key"
        if choice in ("delete", "delete_rs"):
            k = self.rng.choice(state)[0]
            if choice == "delete":
                from delta.tables import DeltaTable
                from pyspark.sql import functions as F

                DeltaTable.forPath(self.spark, path).delete(F.col("k") == k)
            else:
                RsTable(path, storage_options=options).delete(f"k = {k}")
        elif choice == "duplicate":
            from pyspark.sql import functions as F

            k = self.rng.choice(state)[0]
            df = frames.read_updates(self.spark, table).where((F.col("k") == k) & (F.col("_diff") > 0)).limit(1)
            df.write.format("delta").mode("append").save(path)
        else:
            if choice == "change":
                k, v, _ = self.rng.choice(state)
                other = self.rng.choice([x for x in [*VALUES, "foreign"] if x != v])
                rows = [(k, v, t, -1), (k, other, t, 1)]
            else:
                rows = [(100 + self.rng.choice(KEYS), "foreign", t, 1)]
            write_deltalake(path, self.arrow(rows), mode="append", schema_mode="merge", storage_options=options)
        log.info("%s tampered: %s", self.tag, choice)
        self.tampered_below = self.ledger.get_shard(self.cfg.name).upper
        self.staged_before_tamper = set(self.stages_seen)
        return True

    def read_tamper(self, b) -> bool:
        """Was committed batch ``b`` written after the last tampering, so that it repaired it?
        A batch staged before (a crashed run's, rerun after the tampering: its files are kept as
        they are) commits what its write computed without it: the first batch whose write read a
        foreign version repairs it (docs/design.md, Drift), the next one."""
        return b.upper > self.tampered_below and b.stage_id not in self.staged_before_tamper

    @staticmethod
    def arrow(rows: list[tuple]):
        """``(k, v, _time, _diff)`` rows as an Arrow table of the shard's columns."""
        import pyarrow as pa

        k, v, t, d = zip(*rows, strict=True)
        return pa.table(
            {
                "k": pa.array(k, pa.int64()),
                "v": pa.array(v, pa.string()),
                "_error": pa.array([None] * len(k), pa.string()),
                "_time": pa.array(t, pa.int64()),
                "_diff": pa.array(d, pa.int64()),
            }
        )

    # -- invariants -------------------------------------------------------------------------

    @staticmethod
    def as_of(updates: list, t: int) -> Counter:
        """Plain-Python model of a read as of ``t`` over the collected update log."""
        out: Counter = Counter()
        for r in updates:
            if r["_time"] <= t:
                out[(r["k"], r["v"], r["_error"])] += r["_diff"]
        return +out

    def check(self, final: bool = False) -> list[str]:
        if not ShardTable(self.cfg).exists():
            return []
        sync(self.ledger, ShardTable(self.cfg))
        problems = [
            v for v in check.violations(self.ledger, self.cfg, spark=self.spark) if final or "staged files" not in v
        ]
        committed = self.ledger.batches(self.cfg.name, (COMMITTED,))
        since = self.ledger.get_shard(self.cfg.name).since
        updates = (
            frames.read_updates(self.spark, ShardTable(self.cfg)).select("k", "v", "_error", "_time", "_diff").collect()
        )
        if self.current:
            problems += self.check_current(updates, final)
        if self.kind == "upsert":
            problems = self.waive_unrepaired(problems, committed)
            problems += self.check_upsert(committed, since, updates)
            return [f"{self.tag}: {p}" for p in problems]
        for b in committed:
            if b.upper <= self.tampered_below:
                continue  # history rewritten behind the sink's back; repaired at a later time
            if b.upper - 1 < since:
                continue  # compacted: reads before since are not promised
            want = self.source_of.get(b.batch_id)
            if want is None:
                problems.append(f"committed batch {b.batch_id} was never written by this schedule")
                continue
            got = self.as_of(updates, b.upper - 1)
            if got != +want:
                problems.append(f"as of {b.upper - 1}: shard {dict(got)} != model {dict(+want)}")
        return [f"{self.tag}: {p}" for p in problems]

    def check_current(self, updates: list, final: bool) -> list[str]:
        """The current-state table, read by delta-rs, holds the shard's whole collection (error
        rows left out) whenever it reflects the shard's latest version; it may lag after a
        crash or a foreign commit, but not once the settling run has appended."""
        import pyarrow as pa

        ct = CurrentTable(self.cfg)
        if not ct.exists():
            return ["the sink keeps a current-state table and none exists"] if final else []
        dt = ct.snapshot()
        reflected, latest = ct.reflected(dt), ShardTable(self.cfg).latest_version()
        if reflected != latest:
            return [f"current-state table reflects shard version {reflected}, not {latest}"] if final else []
        got = Counter((r["k"], r["v"]) for r in pa.RecordBatchReader.from_stream(dt.scan()).read_all().to_pylist())
        want = Counter({(k, v): n for (k, v, e), n in self.as_of(updates, 1 << 62).items() if e is None})
        return [] if got == want else [f"current-state table {dict(got)} != the shard's collection {dict(want)}"]

    def waive_unrepaired(self, problems: list[str], committed: list) -> list[str]:
        """Tampering no committed batch read yet: the upsert invariants as of the last
        ``upper - 1`` (one value per key, counts of 1) may be broken; the next batch repairs."""
        last = max((b.upper for b in committed), default=None)
        if last is None or not self.tampered_below or any(self.read_tamper(b) for b in committed):
            return problems
        tampered = kinds.of(self.cfg).invariants(frames.read_updates(self.spark, ShardTable(self.cfg)), last - 1)
        return [p for p in problems if p not in tampered]

    def check_upsert(self, committed: list, since: int, updates: list) -> list[str]:
        """A fresh :class:`UpsertModel` replays the committed batches in order, each over the feed
        its write read: the shard's valid rows as of each ``upper - 1`` are its state (unless
        tampered or compacted, as for a query sink), and the batch recorded the model's watermark
        and late commands."""
        problems: list[str] = []
        model = UpsertModel()
        for b in sorted(committed, key=lambda b: b.lower):
            feed = self.source_of.get(b.batch_id)
            if feed is None:
                problems.append(f"committed batch {b.batch_id} was never written by this schedule")
                break  # the model cannot go on without it
            late = model.late
            model.batch([*feed, HINT], b.lower, b.upper)
            recorded = (b.source_offset, b.late_commands)
            if recorded != (model.watermark, model.late - late):
                problems.append(
                    f"batch {b.batch_id} [{b.lower}, {b.upper}) recorded (source_offset, late_commands) {recorded}, "
                    f"the model of the feed its write read {(model.watermark, model.late - late)}"
                )
            if self.tampered_below and not self.read_tamper(b):
                continue  # history rewritten behind the sink's back; repaired at a later time
            if b.upper - 1 < since:
                continue  # compacted: reads before since are not promised
            got = Counter({r: n for r, n in self.as_of(updates, b.upper - 1).items() if r[2] is None})
            want = model.as_of(b.upper - 1)
            if got != want:
                problems.append(f"as of {b.upper - 1}: shard {dict(got)} != model {dict(want)}")
        return problems

    def run(self, steps: int) -> list[str]:
        for _ in range(steps):
            self.step()
            problems = self.check()
            if problems:
                return problems
        # settle: read-only off, one last run; everything must be clean and converged
        self.ledger.ensure_shard(self.cfg.name, self.cfg.as_of)
        self.ledger.set_read_only(self.cfg.name, False)
        run_id, frontier = self.next_run()
        self.one_run(run_id, frontier)
        problems = self.check(final=True)
        upper = self.ledger.get_shard(self.cfg.name).upper
        if upper != frontier:  # e.g. a batch commit the metadata can never absorb stalls the shard
            problems.append(
                f"{self.tag}: not converged: the settling run {run_id} left the shard's "
                f"upper at {upper}, not {frontier}"
            )
        return problems


def run_schedules(
    spark,
    store_url: str | None,
    count: int,
    seed: int,
    steps: int,
    first: int = 0,
    warehouse: str | None = None,
    kind: str = "query",
    current: bool = False,
) -> Stats:
    """``count`` schedules from ``first``, each of a sink of ``kind`` ("query" or "upsert"). The
    warehouse: ``warehouse`` (e.g. ``s3://bucket/prefix``, the AWS environment and the session's
    S3A conf already set), else a fresh local folder."""
    import os

    stats = Stats()
    root = Path(tempfile.mkdtemp(prefix="reconcile-chaos-"))
    old_wh = os.environ.get("RECONCILE_WAREHOUSE")
    os.environ["RECONCILE_WAREHOUSE"] = warehouse or str(root / "warehouse")
    ledger = Ledger(store_url or f"sqlite:///{root / 'metadata.db'}")
    try:
        for i in range(first, first + count):
            stats.schedules += 1
            sched = Schedule(spark, ledger, root, seed, i, stats, kind, current)
            problems = sched.run(steps)
            if problems:
                stats.divergences.extend(problems)
                log.error(
                    "DIVERGENCE (reproduce: python tests/chaos.py --seed %s --first %s --schedules 1 --steps %s%s%s): %s",
                    seed,
                    i,
                    steps,
                    " --s3" if warehouse and warehouse.startswith("s3") else "",
                    ("" if kind == "query" else f" --kind {kind}") + (" --current" if current else ""),
                    problems,
                )
            shutil.rmtree(sched.dir, ignore_errors=True)
    finally:
        ledger.dispose()
        if old_wh is None:
            os.environ.pop("RECONCILE_WAREHOUSE", None)
        else:
            os.environ["RECONCILE_WAREHOUSE"] = old_wh
        shutil.rmtree(root, ignore_errors=True)
    return stats


CHAOS_CONF = {"spark.sql.shuffle.partitions": "1", **TINY_DATA_CONF}


def main(
    schedules: int,
    seed: int,
    steps: int,
    first: int,
    metadata_url: str | None,
    s3: bool = False,
    kind: str = "query",
    current: bool = False,
) -> int:
    import os

    server = None
    warehouse = None
    if s3:  # before the JVM starts: it reads the AWS environment as a deployment's does
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: harness/
        from harness import s3_server

        server = s3_server.start(Path(tempfile.mkdtemp(prefix="reconcile-chaos-s3-")))
        os.environ.update(server.storage_options())
        warehouse = server.url(f"chaos-{seed}-{first}" if kind == "query" else f"chaos-{kind}-{seed}-{first}")
    try:
        # Tables of a few dozen rows: TINY_DATA_CONF (3 schedules: 64 s -> 47 s). Neither setting
        # changes a result; the sink's production settings keep both on.
        spark = get_session("reconcile-chaos", CHAOS_CONF)
        t0 = time.time()
        stats = run_schedules(spark, metadata_url, schedules, seed, steps, first, warehouse, kind, current)
        where = (" store=s3" if server else "") + ("" if kind == "query" else f" kind={kind}")
        where += " current" if current else ""
        print(f"chaos: {stats.line()} seconds={time.time() - t0:.0f}{where}")
        for d in stats.divergences:
            print(f"DIVERGENCE {d}")
    finally:
        if server is not None:
            server.stop()
            shutil.rmtree(server.data_dir.parent, ignore_errors=True)
    return 1 if stats.divergences else 0


if __name__ == "__main__":
    import argparse
    import sys

    ap = argparse.ArgumentParser(description="randomized schedules against the model; prints counts and divergences")
    ap.add_argument("--schedules", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--metadata-url", default=None, help="default: a fresh SQLite file")
    ap.add_argument("--s3", action="store_true", help="the warehouse on an S3 server this script starts")
    ap.add_argument("--kind", choices=KINDS, default="query", help="the sink's kind (upsert: a command feed)")
    ap.add_argument("--current", action="store_true", help="the sink keeps a current-state table (checked too)")
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main(a.schedules, a.seed, a.steps, a.first, a.metadata_url, a.s3, a.kind, a.current))
