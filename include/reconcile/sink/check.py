"""Invariant checks of a shard: the ledger agrees with the Delta log, and nothing is left over.

Used by the crash, race and randomized-schedule tests, and by on-call
(``python -m reconcile check SINK``). Each violation is one readable line.

1. Every lower was committed at most once in the Delta log, and committed lowers strictly
   increase, each equal to the previous batch's upper (the first one is at or after as_of).
2. The ledger's committed batches are exactly the Delta log's batch commits (same ids, lowers,
   uppers, versions) once the metadata is synced.
3. The shard's upper equals the last committed batch's upper (or is at most as_of when none).
4. No staged files remain that can never be committed (:func:`reconcile.sink.sync.stale_staged`),
   and every file a batch commit added is on storage (until a compaction removes it). The next
   append deletes such files (a race's loser's, a superseded batch's), so ``check``
   (:func:`run_check`) reports them as *pending cleanup*, with their age, and as a violation only
   once older than the cleanup horizon (:func:`cleanup_horizon_ms`: twice the schedule's period,
   at least an hour; a day without a schedule); :func:`violations` itself stays strict.
5. Upsert sinks: as of the last committed ``upper - 1`` each key has at most one value and
   every consolidated count is 1.
6. Every committed batch matches its description: its Delta version added exactly the files of
   the committed write attempt, with the manifest's rows per hash partition (from the log; no
   data read). With a SparkSession (``check --deep``), also the rows themselves: per hash
   partition the manifest's row count and checksum (versions whose files were vacuumed after a
   compaction cannot be read), and the kind's invariants (5).
7. Every Delta version carrying the sink's commit guard (``txnAppId``) is the sink's own batch
   (with ``txnVersion`` = its lower) or compaction: a guarded commit without the batch's
   metadata could never be absorbed, and the shard would stall behind it.

Findings, not violations: each foreign Delta version that changed data (operation, engine, rows
of its added and removed files) with the batch that repaired it ("repaired at version N": the
first committed batch whose write read it) or "not yet repaired". ``check --verify``
(:func:`verify_report`) says whether the current state verifies and, apart, which older
batches' recorded history foreign versions altered since; an alteration that is explained and
repaired is a finding unless ``--strict-history``.

``check`` exits as ``status`` does (:func:`reconcile.report.exit_code`): 1 while a violation or
one of ``status``'s NEEDS ACTION lines (:func:`reconcile.report.needs_action`) stands, else 4
while foreign versions are not yet repaired (the shard differs from what its batches committed
until the next batch), else 0; its last line says which.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import cast

from reconcile import kinds
from reconcile.config import SinkConfig
from reconcile.log import iso
from reconcile.manifest import Manifest
from reconcile.model import COMMITTED
from reconcile.report import exit_code, needs_action, repairs_itself
from reconcile.sink.sync import stale_staged
from reconcile.sql_names import spark_name
from reconcile.storage.commits import ForeignCommit, batch_commits
from reconcile.storage.delta import ShardTable
from reconcile.storage.ledger import Ledger

STALE = "staged files remain that can never be committed"


def violations(
    ledger: Ledger, cfg: SinkConfig, *, synced: bool = True, spark=None, table: ShardTable | None = None
) -> list[str]:
    """Every broken invariant, one line each, from the ledger and the Delta log (no JVM); with
    ``spark``, also from the committed rows (checksums, the kind's invariants)."""
    table = table or ShardTable(cfg)
    out: list[str] = []
    shard = ledger.get_shard(cfg.name)
    exists = table.exists()
    entries = table.log_entries(-1)[1] if exists else []
    commits = batch_commits([(v, meta) for v, meta, _ in entries])
    lowers = [c.lower for c in commits]
    if len(set(lowers)) != len(lowers):
        out.append(f"a lower was committed twice in the Delta log: {sorted(lowers)}")
    for prev, cur in zip(commits, commits[1:]):
        if cur.lower != prev.upper:
            out.append(f"batch {cur.batch_id} starts at {iso(cur.lower)}, the previous ended at {iso(prev.upper)}")
    if commits and commits[0].lower < shard.as_of:
        out.append(f"first batch lower {commits[0].lower} is before as_of {iso(shard.as_of)}")
    if synced:
        recorded = sorted(
            ((b.batch_id, b.lower, b.upper, b.delta_version) for b in ledger.batches(cfg.name, (COMMITTED,))),
            key=lambda x: x[1],
        )
        log = [(c.batch_id, c.lower, c.upper, c.version) for c in commits]
        if recorded != log:
            out.append(f"ledger committed batches {recorded} differ from the Delta log's {log}")
        expected_upper = commits[-1].upper if commits else None
        if expected_upper is not None and shard.upper != expected_upper:
            out.append(f"shard upper {iso(shard.upper)} is not the last committed upper {iso(expected_upper)}")
        if expected_upper is None and shard.upper > shard.as_of:
            out.append(f"shard upper {iso(shard.upper)} moved past as_of {iso(shard.as_of)} without a batch")
    for version, meta, txn in entries:
        if txn is None:
            continue
        meta = meta or {}
        op = meta.get("op")
        if op == "batch" and int(meta["lower"]) != txn:
            out.append(
                f"Delta version {version}: batch {meta.get('batch_id')} has txnVersion {txn}, not its lower {meta['lower']}"
            )
        elif op not in ("batch", "compact"):
            out.append(
                f"Delta version {version} carries the sink's commit guard (txnVersion {txn}) but is not "
                f"one of its batches or compactions ({meta}): the metadata can never absorb it"
            )
    stored = table.as_stored() if spark is not None and exists else table  # a schema change waiting: as hashed
    out += batch_differences(ledger, stored, entries, spark)
    if commits and spark is not None:
        from reconcile import kinds
        from reconcile.storage import frames

        out += kinds.of(cfg).invariants(frames.read_updates(spark, stored), commits[-1].upper - 1)
        out += [w for w in frames.wrong_row_keys(spark, stored) if "sink's own" in w]
    if synced:
        stale = stale_staged(ledger, table)
        if stale:
            out.append(f"{STALE}: {stale[:5]}")
    if exists:
        out += missing_files(table)
    return out


def missing_files(table: ShardTable) -> list[str]:
    """Files the table's current snapshot names that are not on storage."""
    present = set(table.files())
    gone = sorted(p for p in table.snapshot_files() if p not in present)
    return [f"the Delta table names {len(gone)} file(s) that are not on storage: {gone[:3]}"] if gone else []


def described_batches(ledger: Ledger, sink: str, entries: list) -> dict[int, Manifest]:
    """{Delta version: the batch's manifest} of the batch commits among ``entries``: what the
    commit records of it, completed by the ledger's manifest where the commit carries no parts."""
    manifests = {b.batch_id: b.manifest for b in ledger.batches(sink, (COMMITTED,)) if b.manifest}
    out = {}
    for version, meta, _ in entries:
        if meta and meta.get("op") == "batch":
            found = Manifest.described(meta, manifests.get(meta["batch_id"]))
            if found is not None:
                out[version] = found
    return out


def batch_differences(ledger: Ledger, table: ShardTable, entries: list, spark=None) -> list[str]:
    """Invariant 6: each batch's Delta version against its description (the commit's own
    per-partition counts, files and checksums, else the ledger's manifest)."""
    from reconcile.sink.verify import commit_differences, log_differences

    described = described_batches(ledger, table.name, entries)
    if not described:
        return []
    out = [line for v, m in sorted(described.items()) for line in log_differences(table, v, m)[:3]]
    if spark is not None:
        out += commit_differences(spark, table, described)[0]
    return out


def verify_checksums(ledger: Ledger, cfg: SinkConfig, spark) -> tuple[list[str], dict[str, int]]:
    """``check --verify``: every committed batch whose ``upper - 1`` is at or after the shard's
    since, against the checksums of the shard as of ``upper - 1`` it recorded when it was
    written (its commit's metadata, else the ledger's manifest), recomputed from the Delta table
    in one Spark job (:func:`reconcile.sink.verify.checksum_differences`). -> (one line per
    partition that differs, counts; ``version``: the Delta version read)."""
    from reconcile.sink.verify import checksum_differences

    table = ShardTable(cfg)
    if not table.exists():
        return [], {"verified": 0, "partitions": 0, "not_verifiable": 0, "before_since": 0, "version": -1}
    table = table.as_stored()  # a schema change waiting for its run: the shard's rows as its batches hashed them
    latest, entries = table.log_entries(-1)
    described = described_batches(ledger, cfg.name, entries)
    lines, counts = checksum_differences(spark, table, described, ledger.get_shard(cfg.name).since, latest)
    return lines, {**counts, "version": latest}


# -- what `check` prints: violations, and findings that are not ---------------------------------

HOUR_MS = 3_600_000


def cleanup_horizon_ms(cfg: SinkConfig) -> int:
    """How long staged files that can never be committed may wait for the cleanup before
    ``check`` calls them a violation: every append deletes them (:func:`reconcile.sink.sync.gc_staged`),
    so twice the sink's schedule period (the next run, with room for a slow one), at least an
    hour; a day for a sink without a schedule (or one Airflow cannot tell the period of)."""
    from reconcile.schedule import schedule_period_ms

    period = schedule_period_ms(cfg.schedule) if cfg.schedule else None
    return max(2 * period, HOUR_MS) if period else 24 * HOUR_MS


def staged_age_ms(table: ShardTable, rel: str, now: int) -> int:
    """Since when a staged directory (``<batch>`` or ``<batch>/<stage>``) was last written: the
    newest modification time of what it holds, or of the directory itself when empty."""
    from datetime import datetime

    from reconcile.storage import files

    fs, root = files.fs_of(f"{table.staging_root}/{rel}")
    newest = None
    try:
        found = fs.find(root, detail=True, withdirs=True)
        infos = list(found.values()) or [fs.info(root)]
    except (FileNotFoundError, OSError):
        return 0
    for info in infos:
        m = info.get("mtime") or info.get("LastModified") or info.get("created")
        if isinstance(m, datetime):
            m = m.timestamp()
        if isinstance(m, int | float):
            newest = max(newest or 0.0, float(m))
    return 0 if newest is None else max(0, now - int(newest * 1000))


def pending_cleanup(
    ledger: Ledger, cfg: SinkConfig, now: int | None = None, table: ShardTable | None = None
) -> list[tuple[str, int]]:
    """[(staged directory, its age in ms)] of the staged files that can never be committed and
    that the next append's cleanup deletes (a race's loser, a superseded batch whose files waited
    for the shard's upper to pass its lower)."""
    from reconcile.schedule import now_ms

    table = table or ShardTable(cfg)
    t = now_ms() if now is None else now
    return [(rel, staged_age_ms(table, rel, t)) for rel in stale_staged(ledger, table)]


def _age(ms: int) -> str:
    from reconcile.report import duration

    return f"{ms // 1000}s" if ms < 60_000 else duration(ms)


def foreign_findings(
    ledger: Ledger, cfg: SinkConfig, table: ShardTable | None = None
) -> tuple[list[str], list[tuple[ForeignCommit, str]]]:
    """(one line per foreign Delta version that changed data: its operation, engine, rows, and
    whether a batch repaired it, "repaired at version N" by the batch whose write read it, or "not
    yet repaired"; ``(version, why)`` of those not yet repaired), from the log's commit files (no
    JVM)."""
    from reconcile import standing as st

    table = table or ShardTable(cfg)
    if not table.exists():
        return [], []
    found = st.with_rows(table, table.foreign_commits(-1, table.latest_version()))
    committed = ledger.batches(cfg.name, (COMMITTED,))
    by = st.fates(committed, found, kinds.repairs_by_key(cfg))
    lines, open_ = [], []
    for f in found:
        who = f" by {f.engine}" + (f" (user {f.user})" if f.user else "")
        when = f" at {iso(f.timestamp)}" if f.timestamp is not None else ""
        b = by[f.version].batch
        if b is not None:
            fate = (
                f"repaired at version {b.delta_version} (batch {b.batch_id}, whose write read version {b.read_version})"
            )
        else:
            open_.append((f, by[f.version].why))
            fate = by[f.version].why
        lines.append(f"foreign Delta version {f.version}: {f.operation}{who}{when}, {st.rows_text(f)}; {fate}")
    return lines, open_


@dataclass
class CheckReport:
    """What ``check`` prints: ``violations`` and ``needs_action`` (exit 1; the latter the lines
    ``status`` prints, :func:`reconcile.report.needs_action`), ``findings`` (said, exit 0), and
    what the shard is known to differ in until the next batch repairs it (exit 4, unless
    something needs action): the foreign versions not yet repaired (``unrepaired``,
    ``(version, why)``), and the differences ``check --verify`` found that they explain
    (``repairing``). The exit code is :func:`reconcile.report.exit_code`'s, as ``status``'s."""

    violations: list[str]
    findings: list[str]
    needs_action: list[str] = field(default_factory=list)
    unrepaired: list[tuple[ForeignCommit, str]] = field(default_factory=list)
    repairing: list[str] = field(default_factory=list)

    def pending(self) -> list[int]:
        """The foreign versions the next batch repairs."""
        return [f.version for f, why in self.unrepaired if repairs_itself(why)]

    def exit_code(self) -> int:
        return exit_code(self.violations + self.needs_action, self.unrepaired)

    def summary(self, sink: str) -> str:
        """The last line: the counts, then what needs action and what the next batch repairs."""
        out = f"{sink}: {len(self.violations)} invariant violation(s), {len(self.findings)} finding(s)"
        if self.needs_action:
            out += f"; {len(self.needs_action)} need(s) action"
        if pending := self.pending():
            names = ", ".join(str(v) for v in pending[:10]) + (" ..." if len(pending) > 10 else "")
            out += (
                f"; {len(pending)} foreign Delta version(s) not yet repaired ({names}): the shard differs from "
                "what its batches committed until the next batch repairs them"
            )
        return out


def run_check(ledger: Ledger, cfg: SinkConfig, *, spark=None, now: int | None = None) -> CheckReport:
    """:func:`violations` (the rows too with ``spark``), except that staged files that can never
    be committed are *pending cleanup* (a finding, with their age) until they are older than
    :func:`cleanup_horizon_ms`; and the foreign commits of the log, as findings. One pass over the
    log: each commit file is read once."""
    table = ShardTable(cfg)
    table.remember_commits()
    out = [v for v in violations(ledger, cfg, spark=spark, table=table) if not v.startswith(STALE)]
    horizon = cleanup_horizon_ms(cfg)
    found: list[str] = []
    for rel, age in pending_cleanup(ledger, cfg, now, table):
        line = f"staged files of {rel} can never be committed, last written {_age(age)} ago"
        if age > horizon:
            out.append(f"{line}: older than the cleanup horizon ({_age(horizon)}), yet no append deleted them")
        else:
            found.append(f"pending cleanup: {line}; the next append deletes them (a violation after {_age(horizon)})")
    lines, unrepaired = foreign_findings(ledger, cfg, table)
    found += lines
    from reconcile.sink import current

    bad, noted = current.findings(cfg, table, ledger.batches(cfg.name, (COMMITTED,)), deep=spark is not None)
    upper = ledger.get_shard(cfg.name).upper
    need = needs_action(ledger.batches(cfg.name), upper, unrepaired)
    return CheckReport(out + bad, found + noted, need, unrepaired)


def _open_note(after: list, by: dict) -> tuple[str, bool] | None:
    """For a difference the foreign versions ``after`` may explain: (`` (foreign Delta versions
    N, not yet repaired...)``, whether the next batch repairs each of them), or None when every
    one of them is repaired."""
    open_ = [f for f in after if by[f.version].batch is None]
    if not open_:
        return None
    names = ", ".join(str(f.version) for f in after[:5]) + (" ..." if len(after) > 5 else "")
    itself = all(repairs_itself(by[f.version].why) for f in open_)
    return (
        f" (foreign Delta versions {names}, not yet repaired{': the next batch repairs them' if itself else ''})",
        itself,
    )


def verify_report(
    ledger: Ledger, cfg: SinkConfig, spark, *, strict_history: bool = False
) -> tuple[CheckReport, dict[str, int]]:
    """``check --verify``, said in two parts: does the *current* state verify (the last committed
    batch's checksums of the shard as of its ``upper - 1``), and which *older* batches' history a
    foreign write altered (their recorded checksums differ because of foreign Delta versions
    after their read). A difference that foreign versions not yet repaired explain, each of which
    the next batch repairs, is ``repairing`` (exit 4: the shard differs until that batch); any
    other difference of the current state is a violation, as is an older difference no foreign
    version explains (corruption, a bug). An alteration explained and repaired is a finding,
    unless ``strict_history``."""
    from reconcile import standing as st

    lines, counts = verify_checksums(ledger, cfg, spark)
    committed = sorted(ledger.batches(cfg.name, (COMMITTED,)), key=lambda b: b.lower)
    rep = CheckReport([], [])
    if not committed:
        return rep, counts
    table = ShardTable(cfg)
    foreign = table.foreign_commits(-1, table.latest_version())
    by = st.fates(committed, foreign, kinds.repairs_by_key(cfg))

    def after(b) -> list:
        seen = b.read_version if b.read_version is not None else b.delta_version
        return [f for f in foreign if seen is not None and f.version > seen]

    current = committed[-1]
    mine = [f"the current state does not verify: {ln}" for ln in lines if ln.startswith(f"batch {current.batch_id} ")]
    counts["current"] = 0 if mine else 1
    note = _open_note(after(current), by) if mine else None
    if note is not None and note[1]:
        rep.repairing += [ln + note[0] for ln in mine]
    else:
        rep.violations += [ln + (note[0] if note else "") for ln in mine]
    for b in committed[:-1]:
        diff = [ln for ln in lines if ln.startswith(f"batch {b.batch_id} ")]
        if not diff:
            continue
        altered = after(b)
        if not altered:
            rep.violations += diff
            continue
        note = _open_note(altered, by)
        if note is not None:
            (rep.repairing if note[1] else rep.violations).extend(ln + note[0] for ln in diff)
            continue
        fixed = [by[f.version].batch for f in altered]
        at = max(x.delta_version for x in fixed if x is not None and x.delta_version is not None)
        names = ", ".join(str(f.version) for f in altered[:5]) + (" ..." if len(altered) > 5 else "")
        line = (
            f"history altered: batch {b.batch_id} [{iso(b.lower)}, {iso(b.upper)}) recorded the shard as of "
            f"{iso(b.upper - 1)}, which foreign Delta versions {names} changed since ({len(diff)} partition(s) "
            f"differ); repaired at version {at}"
        )
        (rep.violations if strict_history else rep.findings).append(line)
    return rep, counts


def _pinned_sources(cfg: SinkConfig, last) -> SinkConfig | None:
    """A query sink over Delta sources whose last committed batch recorded the version of each:
    the sink with every source pinned to that version (``versionAsOf``); else None."""
    from reconcile import kinds
    from reconcile.config import QuerySink
    from reconcile.manifest import source_versions

    versions = source_versions(last.manifest) or {}
    if not kinds.of(cfg).plans_sql:  # a query sink (the kind that plans SQL over its sources)
        return None
    cfg = cast(QuerySink, cfg)
    if not cfg.sources:
        return None
    if any(s.format != "delta" or s.name not in versions for s in cfg.sources):
        return None
    spec = cfg.query.sources
    pinned = {n: s.model_copy(update={"options": {**s.options, "versionAsOf": versions[n]}}) for n, s in spec.items()}
    return cfg.model_copy(update={"query": cfg.query.model_copy(update={"sources": pinned})})


def against_pinned_sources(ledger: Ledger, pinned: SinkConfig, last, spark) -> tuple[CheckReport, str]:
    """``check --verify`` of a query sink over Delta sources: the full comparison of the shard as
    of the last batch's ``upper - 1`` with the query over its sources at the versions that batch
    read (time travel), whichever way the batches took (their changes, or in full). A difference
    is a violation, unless foreign commits since that batch explain it (the next batch repairs
    them)."""
    from reconcile.errors import SourceError
    from reconcile.report import source_text
    from reconcile.storage import frames

    table = ShardTable(pinned)
    at = {s.name: int(dict(s.options)["versionAsOf"]) for s in pinned.sources}  # type: ignore[attr-defined]
    what = f"the query over its sources at the versions the last batch read ({source_text(at)})"
    rep = CheckReport([], [])
    try:
        persist = frames.read_updates(spark, table)
        corr = kinds.of(pinned).correction(spark, persist, kinds.Bounds(last.lower, last.upper, exact=True))
        rows = corr.updates.drop("_part").cache()
        n = rows.count()
        sample = [r.asDict() for r in rows.limit(3).collect()]
        rows.unpersist()
    except SourceError as exc:
        line = f"against the source: {what} cannot be read (a source vacuumed since?): {exc.message}"
        rep.findings.append(line)
        return rep, line
    if n == 0:
        return rep, f"against the source: the shard as of {iso(last.upper - 1)} is {what}: compared in full"
    _, entries = table.history_since(last.read_version if last.read_version is not None else -1)
    own = {c.version for c in batch_commits(entries)}
    foreign = [v for v, meta in entries if v not in own and (meta or {}).get("op") not in ("compact", "maintenance")]
    said = f"the shard as of {iso(last.upper - 1)} differs from {what} in {n} update(s) to correct (e.g. {sample})"
    if foreign:
        rep.repairing.append(f"{said}: foreign Delta version(s) {foreign[:10]} since; the next batch repairs them")
    else:
        rep.violations.append(said)
    return rep, f"against the source: {said}"


def verify_source(ledger: Ledger, cfg: SinkConfig, spark, current_verifies: bool = True) -> tuple[CheckReport, str]:
    """(what it found, one line): the shard as of the last committed ``upper - 1`` against what
    the sink's source defines, where that can be computed. Query and change log: the last
    batch's desired collection, by the checksum it recorded (equal to the shard's when the
    current state verifies). Upsert: every key's latest command the committed batches applied
    (the whole feed read once, :mod:`reconcile.kinds.upsert_drift`). A key whose value differs
    is ``repairing`` when foreign versions not yet repaired touched it (the next batch
    recomputes it from the feed), else a violation. A key the shard holds that the feed has no
    command for is one of two:

    - **a key the feed never had** (a foreign writer added it): foreign versions not yet
      repaired touched it and it held no value before them. This is the signal the next
      batch's repair acts on (it removes such a key, :mod:`reconcile.kinds.upsert_drift`), from
      the same Delta time travel around those versions (:func:`reconcile.sink.drift.find`), so
      the report and the repair cannot disagree. It is exact: the sink's own commits write a
      key's value only from a command of the feed, and every foreign version already repaired
      had its added keys removed by the batch that repaired it (a ``not repairable`` one is
      never called repaired), so a key no command defines that held no value before the
      unrepaired versions came from them alone. Its cost: nothing unless such keys exist and
      foreign versions are unrepaired; then two time-travel reads per run of those versions.
    - **a key whose commands the feed no longer holds** (its retention): every other one (it
      held a value before any unrepaired foreign version touched it, or none touched it: its
      value is the sink's own commit of a command). A finding: not checkable against the source.

    Where the versions around the foreign writes were vacuumed the two cannot be told apart,
    and the line says so."""
    committed = sorted(ledger.batches(cfg.name, (COMMITTED,)), key=lambda b: b.lower)
    rep = CheckReport([], [])
    if not committed:
        return rep, "against the source: nothing committed yet"
    upper = committed[-1].upper
    if (pinned := _pinned_sources(cfg, committed[-1])) is not None:
        return against_pinned_sources(ledger, pinned, committed[-1], spark)
    if not kinds.repairs_by_key(cfg):
        is_ = "is" if current_verifies else "is NOT"
        line = (
            f"against the source: the shard as of {iso(upper - 1)} {is_} the last batch's desired collection (what "
            "its source held when the batch ran: the checksum it recorded); `python -m reconcile dry-run SINK` "
            "compares it with the source now"
        )
        return rep, line.replace("SINK", cfg.name)
    from pyspark.sql import functions as F

    from reconcile.kinds import upsert_drift as ud
    from reconcile.kinds.upsert import decode, read_feed
    from reconcile.sink import drift
    from reconcile.storage import frames

    table = ShardTable(cfg)
    keys = list(cfg.key_columns)  # type: ignore[attr-defined]
    batches = tuple((b.lower, b.upper, b.source_offset) for b in committed)
    done = ud.applied(decode(cfg, read_feed(spark, cfg), ud.LONG_MIN), batches)  # type: ignore[arg-type]
    state, has = ud.feed_state(cfg, done)  # type: ignore[arg-type]
    shard = frames.read_updates(spark, table).where(F.col("_time") <= upper - 1)
    diff = ud.consolidated(cfg, state.unionByName(shard.select(*state.columns).withColumn("_diff", -F.col("_diff"))))  # type: ignore[arg-type]
    wrong = diff.select(*[F.col(spark_name(k)) for k in keys]).distinct().cache()
    retained = ud.semi(wrong, has, keys, "left_anti")
    differ = ud.semi(wrong, has, keys)
    n_keys = has.count()

    def take(df) -> list:
        return df.limit(6).collect()

    found = drift.find(spark, ledger, table, table.latest_version(), upper) if wrong.limit(1).count() else None
    repair = found.repair if found is not None and found.versions else None  # None: nothing unrepaired
    if repair is None:
        sample = {"differ": take(differ), "retained": take(retained)}
    elif repair.keys is None or repair.held is None:  # not comparable: the next batch recomputes every key
        sample = {"repairing": take(differ), "unknown": take(retained)}
    else:
        touched, held = repair.keys, repair.held
        inside = ud.semi(retained, touched, keys)
        sample = {
            "differ": take(ud.semi(differ, touched, keys, "left_anti")),
            "repairing": take(ud.semi(differ, touched, keys)),
            "never": take(ud.semi(inside, held, keys, "left_anti")),
            "retained": take(ud.semi(retained, touched, keys, "left_anti").unionByName(ud.semi(inside, held, keys))),
        }
    pending = found.versions if repair is not None else []  # type: ignore[union-attr]
    versions = ", ".join(str(v) for v in pending[:5]) + (" ..." if len(pending) > 5 else "")
    wrong.unpersist()

    def names(rows) -> str:
        return ", ".join(json.dumps(r.asDict(), default=str, sort_keys=True) for r in rows[:5]) + (
            " ..." if len(rows) > 5 else ""
        )

    at = f"the shard as of {iso(upper - 1)}"

    def name(kind: str, into: list[str], says: str) -> None:
        """One line into ``into`` where the sample holds keys of ``kind``: ``says`` with its
        ``{keys}`` (the first keys) and ``{versions}`` (the foreign versions) filled in."""
        if rows := sample.get(kind):
            into.append(f"{at} " + says.format(keys=names(rows), versions=versions))

    name(
        "differ",
        rep.violations,
        "differs from the feed's latest command for key(s) {keys}, which no foreign Delta version not yet repaired "
        "touched: a bug or a lost write (report it)",
    )
    name(
        "repairing",
        rep.repairing,
        "differs from the feed's latest command for key(s) {keys}: foreign Delta versions {versions} changed them, "
        "not yet repaired (the next batch recomputes them from the feed)",
    )
    name(
        "never",
        rep.repairing,
        "holds key(s) {keys} that the feed never had: foreign Delta versions {versions} added them, not yet "
        "repaired (the next batch removes them)",
    )
    name(
        "retained",
        rep.findings,
        "holds key(s) {keys} that the feed holds no command for any more (its retention dropped them: the sink's "
        "own batches wrote them): not checkable against the source",
    )
    name(
        "unknown",
        rep.findings,
        "holds key(s) {keys} that the feed has no command for: its retention dropped them, or a foreign writer "
        "added them (foreign Delta versions {versions}; the versions around them were vacuumed, so which cannot "
        "be told): the next batch repairs what it can and names the rest",
    )
    ok = "does NOT match" if any(sample.get(k) for k in ("differ", "repairing", "never")) else "matches"
    return rep, f"against the source: {at} {ok} the feed's latest command per key ({n_keys} key(s) with a command)"
