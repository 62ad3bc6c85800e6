"""The ``write`` stage: compute a batch's correction and stage it, without appending it.

### Protocol

1. Load the description from the ledger; a description that is no longer open (superseded by
   a newer mint, or already committed) is skipped, and says so.
2. Roll the metadata forward to the Delta log (:func:`reconcile.sink.sync.sync`): if the shard's
   upper has passed the description's ``lower``, the description is outdated and is marked so;
   the write ends there (only mint mints: the next run, or a rerun of this one, mints anew).
3. Pin the Delta version to read (``read_version``), read persist as of it and the desired
   collection, compute ``correction(desired, persist, lower, upper)`` (a pure function) hash-
   partitioned into P partitions, and stage it as Parquet under a directory of this attempt's
   own inside the table, ``<table>/batches/<batch_id>/<stage_id>/reconcile_part=<p>/``: the
   append adopts these files into the Delta log as they are.
4. Check that the batch adds up (:mod:`reconcile.checksums`, observed in the same Spark action):
   per partition, the checksum of what the kind says the shard must hold as of ``upper - 1``
   equals that of persist as read plus the correction as staged; else the batch fails
   (:class:`~reconcile.checksums.SelfCheckFailed`, nothing staged). Persist's checksum is the
   one the previous batch recorded when only the sink's own commits changed the table since
   (:func:`carried_checksums`); if the batch does not add up with it, the batch is computed again
   with persist observed in full, and a warning says the table changed behind the sink's back.
   Then record the manifest (rows, error rows and checksums per partition, observed while
   writing; the files with their sizes and content digests) in the ledger with state ``staged``:
   a compare-and-set on the attempt the batch names. Attempts of one batch running at once (a
   zombie task and its retry, a command started twice) each stage their own files; the first to
   record its manifest is the batch, the others delete their own files and say so. A write of
   a batch already staged with intact files does nothing; one whose staged files are damaged
   restages and replaces them (the replaced attempt's files are left to the garbage collection,
   which deletes them once no append can commit them: :func:`reconcile.sink.sync.gc_staged`).

### Drift

Whatever was written behind the sink's back since the previous batch read the shard is repaired
by this batch's correction; the batch records how much (``drift_rows``: the sum of absolute
diffs that the foreign Delta versions changed below ``upper``, computed by Delta time travel).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from pyspark.sql import DataFrame, SparkSession

from reconcile import checksums, differential, kinds
from reconcile.checksums import BatchChecks, SelfCheckFailed
from reconcile.config import SinkConfig
from reconcile.errors import StagedBatchInvalid
from reconcile.failpoints import failpoint
from reconcile.kinds.refresh import Refresh
from reconcile.log import event, iso
from reconcile.manifest import Manifest, ManifestUnreadable, Part, Rewrite, source_versions
from reconcile.model import COMMITTED, OPEN_STATES, ROW_KEYS, STAGED, BatchDescription, FeedProgress, Outcome, Staged
from reconcile.sink import catalog, evolve
from reconcile.sink import drift as drift_
from reconcile.sink.sync import sync
from reconcile.sink.verify import missing_columns, parse_manifest, staged_files
from reconcile.storage import feed_stats, files, frames, layout
from reconcile.storage.commits import MAINTENANCE
from reconcile.storage.delta import ShardTable
from reconcile.storage.ledger import Ledger
from reconcile.storage.schema_change import SchemaPlan

log = logging.getLogger(__name__)


@dataclass
class WriteResult:
    outcome: Outcome  # STAGED | ALREADY_STAGED | SKIPPED | OUTDATED
    message: str
    rows_ok: int = 0
    rows_err: int = 0
    drift_rows: int | None = 0  # None: not measurable (the foreign versions were vacuumed)
    partitions: dict | None = None
    batch_id: str | None = None


def carried_checksums(ledger: Ledger, table: ShardTable, lower: int, read_version: int) -> dict[int, int] | None:
    """The shard's checksums as of ``lower - 1``, per partition, as the committed batch ending at
    ``lower`` recorded them, if nothing but that batch's own commit, the sink's compactions (which
    keep every checksum as of a time at or after ``since``) and commits that change no data
    touched the table between the Delta version it read and ``read_version``; else None (the
    write then observes the shard as read)."""
    cfg = table.cfg
    prev = ledger.committed_ending_at(cfg.name, lower)
    b = prev[0] if len(prev) == 1 else None
    if b is None or b.read_version is None or not b.manifest:
        return None
    try:
        manifest = Manifest.from_json(b.manifest)
        if manifest.partitioning != (cfg.partitions, differential.partitioned_by(cfg)):  # other partitions
            return None
        sums = {p: int(manifest.parts[p].shard_checksum or "", 16) for p in range(cfg.partitions)}
    except (ManifestUnreadable, KeyError, ValueError):
        return None
    _, entries = table.history_since(b.read_version)
    for v, meta in entries:
        if v > read_version:
            break
        meta = meta or {}
        # a schema rewrite changed every row's hash (sink/evolve.py): the batch that made it recorded the new ones
        if (meta.get("rekeyed") and meta.get("batch_id") != b.batch_id) or not (
            meta.get("op") in ("compact", MAINTENANCE)
            or (meta.get("op") == "batch" and meta.get("batch_id") == b.batch_id)
        ):
            return None  # a foreign data change (drift), or a commit the record does not cover
    return sums


def batch_correction(
    spark: SparkSession,
    ledger: Ledger,
    cfg: SinkConfig,
    persist: DataFrame,
    lower: int,
    upper: int,
    checks: BatchChecks | None = None,
    empty_shard: bool = False,
    repair: kinds.DriftRepair | None = None,
    exact: bool = False,
    shard_rows: int | None = None,
    previous_sources: dict[str, int] | None = None,
    previous_digest: str | None = None,
    previous_refresh: Refresh | None = None,
    full_why: tuple[str, bool] | None = None,
    files_holding: Callable[[str, list], tuple[DataFrame, int, int] | None] | None = None,
) -> kinds.Correction:
    """The correction of ``(lower, upper)`` against ``persist``, for any kind of sink (``checks``:
    observe its checksums while it is computed; ``empty_shard``: persist holds no update;
    ``repair``: foreign writes a keyed kind must repair beyond its commands' keys; ``previous_*``:
    the previous batch's source versions, query digest and way (:mod:`reconcile.kinds.refresh`),
    when the shard holds exactly what it committed; ``full_why``: why the batch compares in full
    (without them) and whether ``refresh: incremental`` allows it)."""
    kind = kinds.of(cfg)
    wm = ledger.watermark(cfg.name) if kind.reads_feed else None
    why, allowed = full_why or (None, False)
    bounds = kinds.Bounds(
        lower,
        upper,
        wm,
        checks,
        empty_shard,
        repair,
        exact,
        shard_rows,
        previous_sources,
        previous_digest,
        previous_refresh,
        why,
        allowed,
        files_holding,
        lambda src, key, time, offset: feed_stats.feed_key_ranges(src, key, time, offset, lower, wm),
    )
    return kind.correction(spark, persist, bounds)


def self_check(cfg: SinkConfig, batch_id: str, lower: int, upper: int, sums: dict[str, dict[int, int | None]]) -> None:
    """Fail the batch (:class:`SelfCheckFailed`) unless, in every hash partition, the checksum of
    what the kind says the shard must hold as of ``upper - 1`` equals the shard's after the
    correction (persist as read plus the correction as staged). A partition too large to sum
    exactly (:mod:`reconcile.checksums`) is not checked, and its checksums are not recorded."""
    unsure = [p for p in range(cfg.partitions) if sums["desired"][p] is None or sums["shard"][p] is None]
    if unsure:
        event(
            log,
            f"batch {batch_id}: the checksums of hash partition(s) {', '.join(map(str, unsure))} cannot be summed "
            "exactly (a diff of 2^31 or more, or more than 2^31 units of |diff| in one partition of a batch): they are "
            "not recorded (not verifiable); more partitions keep large batches verifiable",
            level=logging.WARNING,
            sink=cfg.name,
        )
    wrong = [p for p in range(cfg.partitions) if p not in unsure and sums["desired"][p] != sums["shard"][p]]
    if wrong:
        p = wrong[0]
        more = f" (and {len(wrong) - 1} more partition(s))" if len(wrong) > 1 else ""
        desired, shard = (checksums.text(sums[side][p] or 0) for side in ("desired", "shard"))
        raise SelfCheckFailed(
            f"batch {batch_id} [{iso(lower)}, {iso(upper)}) does not add up: in hash partition {p} the desired "
            f"collection's checksum is {desired}, the shard's after the correction {shard}{more}",
            sink=cfg.name,
        )


def _damage(table: ShardTable, b) -> str | None:
    """Why the batch's recorded attempt cannot be appended as it is (None: exactly the files its
    manifest names are there, with their sizes and digests)."""
    try:
        staged_files(table, b.batch_id, parse_manifest(table.cfg, b.batch_id, b.manifest))
    except StagedBatchInvalid as exc:
        return str(exc)
    return None


def _lost(b, stage_id: str) -> tuple[Outcome, str]:
    """(outcome, message) for a write attempt whose manifest lost to the batch's state ``b``."""
    if b.state == STAGED:
        return Outcome.ALREADY_STAGED, (
            f"another attempt ({b.stage_id}) of this batch recorded its staged files first; deleted "
            f"this attempt's ({stage_id}); the append commits {b.stage_id}'s"
        )
    if b.state == COMMITTED:
        return Outcome.SKIPPED, (
            f"another attempt of this batch committed it meanwhile (Delta version {b.delta_version}); "
            f"deleted this attempt's ({stage_id}) staged files"
        )
    return (
        Outcome.OUTDATED,
        f"the batch was {b.state} meanwhile ({b.message or 'no message'}); deleted this attempt's staged files",
    )


@dataclass
class Attempt:
    """One write attempt of a batch: what every step needs."""

    spark: SparkSession
    ledger: Ledger
    table: ShardTable
    desc: BatchDescription
    replaces: str | None = None  # the damaged staged attempt this one replaces
    drift: drift_.Drift = field(default_factory=drift_.Drift)  # what foreign writers changed: found by stage()
    read_version: int | None = None  # the Delta version persist is read at: set by stage()
    shard_rows: int | None = None  # update rows the shard holds at read_version (None: not known): set by stage()
    # the Delta source versions the previous batch read, when its checksums are carried: set by stage()
    previous_sources: dict[str, int] | None = None
    previous_digest: str | None = None  # and what it computed (its manifest's query_digest)
    schema: SchemaPlan = field(default_factory=SchemaPlan)  # the sink file's schema change (falsy: none)
    rewrite: SchemaPlan | None = None  # the same, when it rewrites the shard (sink/evolve.py)
    rewritten: Rewrite | None = None  # the shard rewritten into the new schema, as staged: set by stage()
    previous_refresh: Refresh | None = None  # and the way it took (its manifest's refresh)
    # why this batch cannot take its sources' changes, known before computing it, and whether
    # ``refresh: incremental`` allows it: set by stage()
    full_why: tuple[str, bool] | None = None
    stage_id: str = field(default_factory=layout.new_stage_id)
    # derived once: the sink, the batch, this attempt's directory, the fields of its log lines
    cfg: SinkConfig = field(init=False)
    batch_id: str = field(init=False)
    path: str = field(init=False)
    state: dict = field(init=False)

    def __post_init__(self) -> None:
        d = self.desc
        self.cfg, self.batch_id = self.table.cfg, d.batch_id
        self.path = self.table.staging_path(d.batch_id, self.stage_id)
        self.state = dict(sink=self.cfg.name, batch=d.batch_id, lower=d.lower, upper=d.upper, run=d.run_id)

    def lost(self) -> WriteResult:
        """This attempt's files are deleted: another attempt, or a newer mint, decided the batch."""
        files.delete_path(self.path)  # never recorded: no append can commit it
        now_b = self.ledger.get_batch(self.batch_id, self.cfg.name)
        outcome, msg = _lost(now_b, self.stage_id)
        return WriteResult(outcome, event(log, msg, **self.state), batch_id=self.batch_id)


def run_write(spark: SparkSession, ledger: Ledger, cfg: SinkConfig, batch_id: str) -> WriteResult:
    table = ShardTable(cfg)
    b = ledger.get_batch(batch_id, cfg.name)
    attempt = Attempt(spark, ledger, table, BatchDescription.of(b))
    if b.state == COMMITTED:
        msg = event(
            log,
            f"skipping write: an attempt of this batch already committed it (Delta version {b.delta_version})",
            **attempt.state,
        )
        return WriteResult(Outcome.SKIPPED, msg, batch_id=batch_id)
    if b.state not in OPEN_STATES:
        msg = event(log, f"skipping write: batch is {b.state} ({b.message or 'no message'})", **attempt.state)
        return WriteResult(Outcome.SKIPPED, msg)
    table.ensure(lambda: ledger.commit_lease(cfg.name, f"creation of the shard's table (batch {batch_id})"))
    catalog.register(spark, cfg)
    shard = sync(ledger, table)
    if shard.upper > attempt.desc.lower:
        return absorb_outdated(attempt, shard.upper)
    attempt.schema = table.check_schema()  # the sink file's schema change this batch applies (falsy: none)
    attempt.rewrite = attempt.schema if attempt.schema.rewrites else None  # ... by rewriting the shard too
    if (kept := keep_intact(attempt)) is not None:
        return kept
    staged = stage(attempt)
    if isinstance(staged, WriteResult):
        return staged
    return record(attempt, staged)


def absorb_outdated(attempt: Attempt, shard_upper: int) -> WriteResult:
    """The shard's upper passed the batch's lower: the batch is committed (the sync absorbed an
    earlier attempt's commit) or outdated (another writer moved the upper), never written."""
    desc, state = attempt.desc, attempt.state
    # Re-read: the sync may just have absorbed this batch's own commit.
    b = attempt.ledger.get_batch(desc.batch_id, attempt.cfg.name)
    if b.state == COMMITTED:
        msg = event(
            log, "skipping write: an earlier attempt already committed this batch (metadata rolled forward)", **state
        )
        return WriteResult(Outcome.SKIPPED, msg, batch_id=desc.batch_id)
    attempt.ledger.mark_superseded(
        desc.batch_id, f"outdated before write: another writer moved the shard's upper to {iso(shard_upper)}"
    )
    rest = (
        "the shard already covers this batch's interval"
        if desc.upper <= shard_upper
        else f"[{iso(shard_upper)}, {iso(desc.upper)}) is appended by the next run, or by clearing this whole run "
        f"(its mint starts from {iso(shard_upper)})"
    )
    msg = event(
        log,
        f"not writing: the batch is outdated, another writer moved the shard's upper to {iso(shard_upper)}; {rest}",
        shard_upper=shard_upper,
        **state,
    )
    return WriteResult(Outcome.OUTDATED, msg)


def keep_intact(attempt: Attempt) -> WriteResult | None:
    """A batch already staged with intact files is kept (the append commits it); one whose staged
    files are damaged is restaged by this attempt, which then replaces it (``attempt.replaces``).
    Each attempt stages under a directory of its own; recording the manifest is a compare-and-set
    on the attempt the batch names now (None, or the damaged attempt this one replaces)."""
    # Re-read after the sync: another attempt may have staged the batch meanwhile.
    b = attempt.ledger.get_batch(attempt.batch_id, attempt.cfg.name)
    if b.state == STAGED:
        damage = _damage(attempt.table, b) or _stale_schema(attempt, b)
        if damage is None:
            msg = event(
                log,
                f"skipping write: attempt {b.stage_id} already staged this batch "
                f"({b.rows_ok} ok, {b.rows_err} error rows); the append commits it",
                **attempt.state,
            )
            return WriteResult(
                Outcome.ALREADY_STAGED, msg, b.rows_ok or 0, b.rows_err or 0, b.drift_rows, batch_id=attempt.batch_id
            )
        attempt.replaces = b.stage_id
        event(
            log,
            f"restaging: the staged attempt {b.stage_id} cannot be appended: {damage}",
            level=logging.WARNING,
            **attempt.state,
        )
    others = sorted(set(attempt.table.staged_attempts(attempt.batch_id)) - {attempt.replaces})
    if others:
        event(
            log,
            f"other attempt(s) of this batch are writing or died writing ({', '.join(others)}); "
            "the first to record its manifest is the batch, the others delete their files",
            **attempt.state,
        )
    return None


def _stale_schema(attempt: Attempt, b) -> str | None:
    """Why a staged batch does not apply the sink file's schema change as the table needs it now
    (None: it does): staged before the sink file changed (without the shard's rewrite, or without
    a new column), with a rewrite of an older Delta version (the table moved since), or with one
    the table no longer needs."""
    manifest = parse_manifest(attempt.cfg, b.batch_id, b.manifest)
    staged = manifest.rewrite
    if attempt.schema and staged is None and manifest.stage_id:
        named = sorted(f for f in manifest.staged_files() if layout.part_of(f) is not None)
        where = layout.staged_relative(b.batch_id, manifest.stage_id, named[0]) if named else None
        missing = missing_columns(attempt.table, where) if where else []
        if missing:
            return f"it was staged before the sink file's schema change: its files have no column {', '.join(missing)}"
    if attempt.rewrite is not None and staged is None:
        return f"it was staged before the sink file's schema change ({attempt.rewrite.describe()})"
    latest = attempt.table.latest_version()
    if attempt.rewrite is not None and staged is not None and staged.read_version != latest:
        return f"it rewrites the shard as of Delta version {staged.read_version}, the table is at {latest} now"
    if attempt.rewrite is None and staged is not None:
        return "it rewrites the shard into a schema the table has, or the sink file no longer asks for"
    return None


@dataclass
class StagedFiles:
    """What one attempt staged: the correction, its statistics and checksums per partition, and
    the files written (sizes, digests) at the Delta version persist was read."""

    corr: kinds.Correction
    stats: dict[int, dict]
    sums: dict | None
    read_version: int
    sizes: dict[str, int]
    digests: dict[str, str]


def stage(attempt: Attempt) -> StagedFiles | WriteResult:
    """Compute the correction against persist as of the latest Delta version and stage it. If it
    fails while another attempt decided the batch, this attempt's files go and it says so."""
    try:
        read_version = attempt.read_version = attempt.table.latest_version()
        attempt.shard_rows = frames.update_rows(attempt.table, read_version)
        persist = read_persist(attempt, read_version)
        empty = frames.holds_nothing(attempt.table, read_version)
        differential.label_jobs(attempt.spark, "reconcile: drift (foreign versions since the last batch)")
        attempt.drift = drift_.find(attempt.spark, attempt.ledger, attempt.table, read_version, attempt.desc.upper)
        differential.label_jobs(attempt.spark, "reconcile: the correction and its staged write")
        carried = None
        if attempt.rewrite is None:  # a rewrite changes every row's hash: nothing recorded before is carried
            carried = carried_checksums(attempt.ledger, attempt.table, attempt.desc.lower, read_version)
        if carried is not None:  # the shard holds exactly what the previous batch committed
            (prev,) = attempt.ledger.committed_ending_at(attempt.cfg.name, attempt.desc.lower)
            attempt.previous_sources = source_versions(prev.manifest)
            before = Manifest.from_json(prev.manifest)
            attempt.previous_digest, attempt.previous_refresh = before.query_digest, before.refresh
            if not attempt.previous_sources:
                attempt.full_why = ("the previous batch recorded no source versions", False)
        else:
            attempt.full_why = (not_carried(attempt), False)
        corr, stats, sums = _stage_until_it_adds_up(attempt, persist, carried if checksums.ENABLED else None, empty)
        if attempt.rewrite is not None:  # the projection persist was, staged beside the correction
            stage_rewrite(attempt, read_version)
        failpoint("write.after_partition_staged")
        sizes = files.list_files(attempt.path)
        digests = {rel: files.digest(f"{attempt.path}/{rel}") for rel in sizes}
    except Exception:
        now_b = attempt.ledger.get_batch(attempt.batch_id, attempt.cfg.name)
        if now_b.state in OPEN_STATES and now_b.stage_id == attempt.replaces:
            files.delete_path(attempt.path)  # this attempt's files: never recorded, so never committed
            raise  # nobody else finished: this attempt's own failure
        return attempt.lost()
    return StagedFiles(corr, stats, sums, read_version, sizes, digests)


def desc_version(attempt: Attempt) -> int:
    """The Delta version the attempt reads the shard at (set by :func:`stage`)."""
    assert attempt.read_version is not None
    return attempt.read_version


def not_carried(attempt: Attempt) -> str:
    """Why the shard's checksums are not carried from the previous batch (so a query batch cannot
    take its sources' changes)."""
    if attempt.drift.versions:
        listed = ", ".join(map(str, attempt.drift.versions[:5]))
        return f"the shard was written behind the sink's back since the previous batch (Delta version(s) {listed})"
    if not attempt.ledger.committed_ending_at(attempt.cfg.name, attempt.desc.lower):
        return "no committed batch ends at this batch's lower"
    return "the shard's checksums are not carried from the previous batch (a schema rewrite, or none recorded)"


def stage_rewrite(attempt: Attempt, read_version: int) -> None:
    """Stage the shard rewritten into the sink file's schema beside the correction computed
    against it (:mod:`reconcile.sink.evolve`); the append commits both in one Delta version."""
    plan = attempt.rewrite
    assert plan is not None
    differential.label_jobs(attempt.spark, "reconcile: the shard rewritten into the sink file's schema")
    try:
        rows = evolve.stage_rewrite(attempt.spark, attempt.table, read_version, plan, attempt.path)
    finally:
        differential.label_jobs(attempt.spark, None)
    attempt.rewritten = Rewrite(read_version, plan.describe(), rows, {})
    event(
        log,
        f"staged the shard rewritten into the sink file's schema ({plan.describe()}) with the batch",
        rows_rewritten=rows,
        read_version=read_version,
        **attempt.state,
    )


def read_persist(attempt: Attempt, read_version: int) -> DataFrame:
    """The shard as read at ``read_version``: for a kind that compares row keys first, with each
    row's stored key (:func:`reconcile.storage.frames.read_keyed`; what it had to hash is said on
    the batch's log), else its rows."""
    if attempt.rewrite is not None:  # the shard as the batch's commit leaves it: the new schema, fresh keys
        persist = evolve.projected(attempt.spark, attempt.table, read_version, attempt.rewrite)
        return persist if kinds.of(attempt.cfg).hashes_first else persist.drop(*ROW_KEYS)
    if not kinds.of(attempt.cfg).hashes_first:
        return frames.read_updates(attempt.spark, attempt.table, read_version)
    persist, how = frames.read_keyed(attempt.spark, attempt.table, read_version)
    level = logging.INFO if not how.hashed else logging.WARNING
    event(log, f"persist at Delta version {read_version}: {how.line()}", level=level, **attempt.state)
    return persist


# Why a batch that did not add up is computed again, by what it changes (see _stage_until_it_adds_up).
AGAIN = {
    "exact": "this batch was computed again comparing every row in full (no hash-first pass) and adds up: a key "
    "collision of the hash-first pass, or a desired collection that changed between its two reads (a "
    "nondeterministic query)",
    "observed": "the shard as read does not have the checksums the previous batch recorded: the table changed "
    "behind the sink's back, or it or the record is damaged; this batch was computed again with the shard "
    "observed in full and adds up (`python -m reconcile check SINK --verify` names the partitions)",
}


def _stage_until_it_adds_up(attempt: Attempt, persist: DataFrame, carried: dict[int, int] | None, empty: bool) -> tuple:
    """Stage the correction; if it does not add up (:class:`SelfCheckFailed`), compute it again
    comparing every row in full (a kind that hashes first), then with the shard observed in full
    (when its checksums were carried). A batch that still does not add up fails: a bug."""
    hashed = checksums.ENABLED and not empty and kinds.of(attempt.cfg).hashes_first and hash_first_pays(attempt)
    ways: list[tuple[dict[int, int] | None, bool, str | None]] = [(carried, not hashed, None)]
    if hashed:
        ways.append((carried, True, "exact"))
    if carried is not None:
        ways.append((None, True, "observed"))
    for i, (carry, exact, why) in enumerate(ways):
        try:
            staged = _stage_checked(attempt, persist, carry, empty, exact, incremental=i == 0)
        except SelfCheckFailed:
            if i == len(ways) - 1:
                raise
            files.delete_path(attempt.path)
            continue
        if why is not None:
            event(log, AGAIN[why], level=logging.WARNING, **attempt.state)
        return staged
    raise AssertionError("unreachable")


# The shard's update rows from which a query batch compares row keys first: below it, a second
# Spark job costs more than shuffling every row once. Since persist's key is read as stored and the
# desired side is evaluated once (bench/profile_query.py, 1M rows, 1% changed, side by side on a
# busy machine: 74.6 s hashing first, 41 MB shuffled, against 88.7 s comparing in full, 348 MB),
# it pays from well below 1M rows (it was 4M while both sides were read and hashed twice).
# RECONCILE_HASH_FIRST_MIN_ROWS sets another (the tests and bench/hash_first.py: 0).
HASH_FIRST_MIN_ROWS = 200_000


def hash_first_pays(attempt: Attempt) -> bool:
    """Does the shard as read hold enough update rows for the hash-first pass to pay?"""
    least = int(os.environ.get("RECONCILE_HASH_FIRST_MIN_ROWS") or HASH_FIRST_MIN_ROWS)
    return attempt.shard_rows is not None and attempt.shard_rows >= least


def _stage_checked(
    attempt: Attempt,
    persist: DataFrame,
    carried: dict[int, int] | None,
    empty: bool,
    exact: bool = False,
    incremental: bool = False,
) -> tuple:
    """Stage the correction once with plain checksum sums; if a sum overflowed, once more with
    the guarded ones (the kind's own arithmetic overflowing fails again, as it should).
    ``incremental``: a kind may compute it from its sources' changes (the first way only)."""
    try:
        return _stage_once(attempt, persist, carried, empty, guarded=False, exact=exact, incremental=incremental)
    except Exception as exc:
        if not (checksums.ENABLED and checksums.overflowed(exc)):
            raise
        files.delete_path(attempt.path)
        return _stage_once(attempt, persist, carried, empty, guarded=True, exact=exact)


def _stage_once(
    attempt: Attempt,
    persist: DataFrame,
    carried: dict[int, int] | None,
    empty: bool,
    guarded: bool,
    exact: bool = False,
    incremental: bool = False,
) -> tuple:
    """(correction, statistics per partition, checksums or None) of one staged correction, after
    the self-check (:func:`self_check`). ``empty``: the shard as read holds no update."""
    cfg, desc = attempt.cfg, attempt.desc
    checks = BatchChecks(cfg, desc.lower, desc.upper, attempt.stage_id, carried, guarded) if checksums.ENABLED else None
    corr = batch_correction(
        attempt.spark,
        attempt.ledger,
        cfg,
        persist,
        desc.lower,
        desc.upper,
        checks,
        empty,
        attempt.drift.repair,
        exact,
        attempt.shard_rows,
        attempt.previous_sources if incremental else None,
        attempt.previous_digest,
        attempt.previous_refresh,
        attempt.full_why if incremental else ("computed again in full after the batch did not add up", True),
        None  # persist is the shard projected into the sink file's new schema, not the table's files
        if attempt.rewrite is not None
        else lambda column, keys: frames.read_files_holding(
            attempt.spark, attempt.table, desc_version(attempt), column, keys
        ),
    )
    try:
        stats: dict[int, dict] = {}
        if corr.nothing:  # a correction known to hold nothing: its directory, no file, no Spark job
            files.make_empty_dir(attempt.table.staging_path(desc.batch_id, attempt.stage_id))
        else:
            with checksums.observable(attempt.spark):  # the checksums and an upsert feed's progress
                _, stats = frames.write_staged(
                    attempt.spark, attempt.table, desc.batch_id, attempt.stage_id, corr.updates, checks
                )
    finally:
        differential.release()  # what the correction cached
        differential.label_jobs(attempt.spark, None)
    if checks is None:
        return corr, stats, None
    sums = checks.totals()
    self_check(cfg, desc.batch_id, desc.lower, desc.upper, sums)
    return corr, stats, sums


def manifest_of(attempt: Attempt, staged: StagedFiles) -> Manifest:
    """The manifest of what the attempt staged: per partition its statistics, files, digests and
    (when summed exactly) the checksums ``check --verify`` recomputes."""
    parts = {}
    for p in range(attempt.cfg.partitions):
        mine = sorted(k for k in staged.sizes if layout.part_of(k) == p)
        stats = staged.stats.get(p, {"rows": 0, "err": 0, "weight": 0, "checksum": "0", "net": 0})
        desired, shard = (None, None) if staged.sums is None else (staged.sums["desired"][p], staged.sums["shard"][p])
        parts[p] = Part(
            rows=stats["rows"],
            checksum=stats["checksum"],
            err=stats["err"],
            weight=stats["weight"],
            net=stats["net"],
            files={k: staged.sizes[k] for k in mine},
            digests={k: staged.digests[k] for k in mine},
            desired_checksum=checksums.text(desired) if desired is not None and shard is not None else None,
            shard_checksum=checksums.text(shard) if desired is not None and shard is not None else None,
        )
    desc = attempt.desc
    return Manifest(
        batch_id=desc.batch_id,
        lower=desc.lower,
        upper=desc.upper,
        partitions=attempt.cfg.partitions,
        parts=parts,
        stage_id=attempt.stage_id,
        read_version=staged.read_version,
        feed=staged.corr.progress,
        drift=attempt.drift.record(attempt.cfg, staged.corr),
        sources=staged.corr.sources,
        query_digest=staged.corr.query_digest,
        rewrite=_rewrite_of(attempt, staged),
        refresh=staged.corr.refresh,
        partitioned_by=differential.partitioned_by(attempt.cfg),
    )


def _rewrite_of(attempt: Attempt, staged: StagedFiles) -> Rewrite | None:
    """The manifest's record of the shard's rewrite staged with the batch (None: none)."""
    r = attempt.rewritten
    if r is None:
        return None
    mine = sorted(k for k in staged.sizes if k.startswith(f"{evolve.REWRITE_DIR}/"))
    return replace(r, files={k: staged.sizes[k] for k in mine}, digests={k: staged.digests[k] for k in mine})


def record(attempt: Attempt, staged: StagedFiles) -> WriteResult:
    """Record the manifest in the ledger (compare-and-set on the attempt the batch names): this
    attempt's files are then the batch; if another attempt recorded first, they are deleted."""
    desc, state = attempt.desc, attempt.state
    manifest = manifest_of(attempt, staged)
    drift = attempt.drift.rows
    unrepairable = (manifest.drift or {}).get("unrepairable_count")
    if unrepairable:
        event(
            log,
            f"{unrepairable} key(s) that foreign writes touched have no command in the feed and held a value "
            "before: not repaired (put each key's last command back in the feed; the next batch repairs them)",
            level=logging.WARNING,
            **state,
        )
    feed = staged.corr.progress
    if feed is not None and feed.late_commands:
        event(
            log,
            f"{feed.late_commands} late command(s) (time below lower {iso(desc.lower)}, arrived after "
            "their time's batch) are applied at lower",
            level=logging.WARNING,
            **state,
        )
    row = Staged(
        attempt.stage_id,
        manifest.to_json(),
        manifest.rows_ok,
        manifest.rows_err,
        staged.read_version,
        drift,
        feed=feed,
        rows_net=manifest.rows_net,
    )
    won, _ = attempt.ledger.mark_staged(desc.batch_id, row, replaces=attempt.replaces)
    if not won:
        return attempt.lost()
    failpoint("write.after_staged")
    progress = FeedProgress.flat(feed)
    way = {"refresh": manifest.refresh_text()} if manifest.refresh is not None else {}
    read = {"files_read": "{} of {}".format(*staged.corr.files_read)} if staged.corr.files_read else {}
    msg = event(
        log, "staged batch", **row.summary(), partitions=attempt.cfg.partitions, **way, **read, **progress, **state
    )
    parts = manifest.to_dict()["parts"]
    return WriteResult(Outcome.STAGED, msg, manifest.rows_ok, manifest.rows_err, drift, parts, desc.batch_id)
