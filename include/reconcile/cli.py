"""Operator CLI: ``python -m reconcile <command>`` (also installed as ``reconcile``).

Commands:
  validate [--no-spark]    check every sink config in RECONCILE_SINKS_DIR (and plan query sinks' SQL)
  schema                   print the JSON schema of a sink config file (for editors)
  db upgrade|downgrade|current
                           manage the ledger's schema (Alembic)
  status SINK [--json]     frontiers, read-only flag and the last batches of a shard (with causes)
  status [--json]          every sink, one line each: those needing action first, counts per state
  show SINK [--as-of T] [--log] [--errors] [--limit N] [--spark]
                           the shard as of T (default upper - 1), its update log, or its errors
  read-only SINK on|off    switch a shard's read-only mode
  dry-run SINK [--frontier T] [--limit N] [--spark]
                           compute and report the correction of the next batch; writes nothing
  run SINK [--frontier T] [--run-id ID]
                           one batch without Airflow (mint, write, append in this process)
  approve SINK BATCH       let a batch the correction guard stopped be appended
  check SINK [--deep] [--verify]
                           sync the metadata, then list invariant violations (ledger vs Delta log;
                           --verify: each batch's recorded checksum of the shard as of upper - 1)
  check --all              every sink's check in turn, then one line of counts
  recover SINK [--force]   rebuild the shard's metadata from its Delta log (lost, restored or ahead)
  rebuild-current SINK     write the sink's current-state table whole from the shard
  compact SINK [--since T] [--no-vacuum]
                           advance since, consolidate the history before it, vacuum old files
  history SINK [--as-of T] [--key K] [--errors] [--limit N] [--json] [--sql [--dialect D]] [--spark]
                           type-2 versions (valid_from, valid_to) per key (upsert) or distinct row
  diff SINK --from T1 --to T2 [--errors] [--limit N] [--json] [--spark]
                           rows added and removed (with counts) in T1 < time <= T2
  demo                     run the demo sink for three intervals through Airflow and print it

status and check exit 0 (nothing wrong), 1 (needs action: a NEEDS ACTION line or a violation),
4 (foreign Delta versions not yet repaired: the next batch repairs them) or 2 (an error); every
command exits 2 on an error, its one line on stderr. Without a sink (status, check --all) they
exit with the worst of their sinks' codes: 1 over 4 over 0 (check --all: 2 before 4).

Times (T, T1, T2) are epoch ms or ISO-8601 (naive: UTC). show, history and diff read the shard
without a JVM (DuckDB over delta-rs); --spark reads it with Spark, whose output goes to a log file.
dry-run computes the next correction with DuckDB where that is exact (else, or with --spark, Spark).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from reconcile import remedy, settings
from reconcile.errors import SinkError, brief
from reconcile.log import iso, parse_time

if TYPE_CHECKING:
    from reconcile.model import FeedProgress


def _ledger():
    from reconcile.storage.ledger import Ledger

    return Ledger(settings.metadata_url())


def cmd_validate(args) -> int:
    """Every config of the folder: ``ok`` or one ``INVALID`` line per problem (all of a file's);
    each query sink's SQL planned against its sources' schemas in Spark, unless --no-spark."""
    from reconcile import kinds
    from reconcile.config_loading import load_dir
    from reconcile.config_messages import problems_of

    configs, errors = load_dir(args.dir)
    queries = [cfg for cfg in configs if kinds.of(cfg).plans_sql]
    planned: dict = {}
    failed = False
    if queries and not args.no_spark:
        import time

        from reconcile.preflight import plan_queries

        how = "a Spark Connect server" if os.environ.get("RECONCILE_SPARK_REMOTE") else "a local Spark JVM"
        print(
            f"planning the SQL of {len(queries)} query sink(s) against their sources with {how} "
            "(10-30 s to start; --no-spark skips it)",
            flush=True,
        )
        t0 = time.monotonic()
        try:
            planned = plan_queries(queries)
            print(f"planned in {time.monotonic() - t0:.1f} s", flush=True)
        except SinkError as exc:
            print(f"error: {exc}", file=sys.stderr)
            failed = True
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=8) as pool:  # each shard's log read (delta-rs releases the GIL)
        schema_lines = dict(zip([c.name for c in configs], pool.map(_schema_change_lines, configs), strict=True))
    for cfg in configs:
        problem = planned.get(cfg.name)
        if problem is not None:
            print(f"INVALID {problem}")
            continue
        sql = ""
        if kinds.of(cfg).plans_sql:
            sql = ", SQL planned" if cfg.name in planned else ", SQL not planned"
        changed = schema_lines[cfg.name]
        refused = any(line.startswith("INVALID") for line in changed)
        if not refused:  # a sink its next run refuses is not ok, whatever the file alone says
            print(f"ok      {cfg.name} ({cfg.kind}, {len(cfg.columns)} columns, P={cfg.partitions}{sql}) {cfg.path}")
        for line in changed:
            print(line)
        failed = failed or refused
    for err in errors:
        for problem in problems_of(err):
            print(f"INVALID {problem}")
    return 1 if failed or errors or any(planned.values()) else 0


def _schema_change_lines(cfg) -> list[str]:
    """What the next run does with the sink file's schema against its shard's (issue 52): nothing
    when they are the same or the shard does not exist yet; else the changes, whether a run
    applies them and what that costs (``INVALID``: the run refuses)."""
    from reconcile.storage.delta import ShardTable

    table = ShardTable(cfg)
    try:
        if not table.exists():
            return []
        plan = table.schema_plan()
    except Exception as exc:  # noqa: BLE001 - an unreachable warehouse: the file is still checked
        return [f"        {cfg.name}: the shard's schema was not compared ({brief(exc, 200)})"]
    notes = [n for n in plan.notes if n != "foreign"]
    out = [f"        {cfg.name}: note: {n}" for n in notes]
    if not plan:
        return out
    rows = "?" if plan.rows is None else f"{plan.rows}"
    if "foreign" in plan.notes:
        return [
            *out,
            f"INVALID {cfg.name}: the shard's Delta table was changed behind the sink's back (the sink file against "
            f"it: {plan.describe()}), "
            "not by the sink file: restore it (Delta RESTORE to the last version the sink committed)",
        ]
    if not plan.supported:
        what = "upsert key" if any(c.key for c in plan.changes) else "columns"
        return [
            *out,
            f"INVALID {cfg.name}: the sink file {cfg.path} changes the shard's {what}, which no run applies: "
            f"{plan.refusal()}; keep the shard's {what} or move the new schema to a new sink",
        ]
    return [
        *out,
        f"        {cfg.name}: schema change applied by the next run in its batch's commit: {plan.describe()}; "
        f"cost: {plan.cost()} (the shard holds {rows} update rows)",
    ]


def cmd_schema(args) -> int:
    import json

    from reconcile.config import json_schema

    print(json.dumps(json_schema(), indent=2, sort_keys=True))
    return 0


def cmd_db(args) -> int:
    from reconcile.storage.engine import current_revision, downgrade, make_engine, upgrade

    engine = make_engine(settings.metadata_url())
    if args.action == "upgrade":
        upgrade(engine)
    elif args.action == "downgrade":
        downgrade(engine, args.revision or "base")
    print(f"metadata schema revision: {current_revision(engine)} at {engine.url.render_as_string(hide_password=True)}")
    return 0


def cmd_status(args) -> int:
    from reconcile import report

    if args.sink is None:
        return status_all(args.json)
    data = report.status_data(_ledger(), args.sink, args.limit)
    if args.json:
        import json

        print(json.dumps(data, indent=2))
    else:
        report.print_status(data)
    unrepaired = [(f["version"], f.get("why") or "") for f in data["foreign_unrepaired"] or []]
    return report.exit_code(data["needs_action"], unrepaired)  # as check's (docs/operating.md, "Exit codes")


def status_all(as_json: bool) -> int:
    """``status`` without a sink: every sink of the sinks folder, one line each, those needing
    action first, with counts per state (:mod:`reconcile.fleet`); exits with the worst of their
    ``status SINK`` exit codes."""
    from reconcile import fleet
    from reconcile.config_loading import load_dir
    from reconcile.schedule import now_ms

    configs, errors = load_dir()
    ledger = _ledger()
    try:
        now = now_ms()
        healths = fleet.survey(ledger, configs, errors, now)
    finally:
        ledger.dispose()
    if as_json:
        import json

        print(json.dumps(fleet.fleet_json(healths, now), indent=1))
    else:
        fleet.print_fleet(healths, now)
    return fleet.fleet_exit_code(healths)


def spark_log(command: str):
    """This process's Spark log file: ``reconcile-<command>-spark-<uid>-<pid>.log`` in the temp
    folder (one per command run: two sessions of a user never write into one)."""
    import os
    import tempfile
    from pathlib import Path

    return Path(tempfile.gettempdir()) / f"reconcile-{command}-spark-{os.getuid()}-{os.getpid()}.log"


def quiet_spark(command: str, app: str | None = None):
    """A Spark session for ``command`` (application name ``app``, default ``reconcile-<command>``)
    whose JVM writes its banner and warnings to a log file (:func:`spark_log`), not to this
    command's output; a Spark Connect client when ``RECONCILE_SPARK_REMOTE`` is set (no JVM here)."""
    from reconcile.preflight import quiet_session

    log = spark_log(command)
    try:
        return quiet_session(app or f"reconcile-{command}", log)
    except Exception as exc:
        raise SinkError(
            f"Spark did not start for {command}: {brief(exc)} (Spark's log: {log})",
            remedy="check Java (JAVA_HOME) and RECONCILE_SPARK_REMOTE.",
        ) from None


def cmd_show(args) -> int:
    from reconcile.config_loading import load_sink
    from reconcile.report import show_shard

    cfg = load_sink(args.sink)
    as_of = None if args.as_of is None else parse_time(args.as_of, "--as-of")
    ledger = _ledger()
    ledger.get_shard(cfg.name)  # an unknown shard is refused before any read
    spark = quiet_spark("show") if args.spark else None
    show_shard(spark, ledger, cfg, as_of, log=args.log, errors=args.errors, limit=args.limit, as_json=args.json)
    return 0


def cmd_read_only(args) -> int:
    from reconcile.config_loading import load_sink

    cfg = load_sink(args.sink)
    ledger = _ledger()
    ledger.ensure_shard(cfg.name, cfg.as_of)
    ledger.set_read_only(cfg.name, args.state == "on")
    print(f"shard {cfg.name}: read_only={args.state == 'on'}")
    return 0


def cmd_dry_run(args) -> int:
    from reconcile.config_loading import load_sink
    from reconcile.sink.dry_run import next_correction

    cfg = load_sink(args.sink)
    frontier = None if args.frontier is None else parse_time(args.frontier, "--frontier")
    result = next_correction(_ledger(), cfg, frontier, args.limit, args.spark, _dry_run_spark)
    lower, upper, which = iso(result.lower), iso(result.upper), result.upper_from
    if result.upper <= result.lower:
        print(f"dry run: {which} upper {upper} is not ahead of lower {lower}: a run would mint nothing")
        return 0
    title = f"dry run of {cfg.name}: batch [{lower}, {upper}) (upper: {which}) would write; nothing was written"
    if result.preview is not None:
        _print_preview(title, result.preview, result.guard)
    else:
        assert result.spark is not None
        _print_spark_correction(title, result.spark, result.guard, cfg.partitions, args.limit)
    return 0


def _dry_run_spark(why: str | None):
    """The Spark session of ``dry-run``, after saying why DuckDB's correction was not taken."""
    if why is not None:
        print(f"dry run with Spark, as the run computes it: {why}")
    return quiet_spark("dry-run")  # the correction is Spark's (the sink's SQL, its sources)


def _print_preview(title: str, p, guard: str | None) -> None:
    """``dry-run``'s report of a correction computed without a JVM (:mod:`reconcile.sink.dry_run`)."""
    from reconcile.report import print_rows

    print(f"{title} (computed by DuckDB without a JVM; --spark computes it with Spark):")
    print(
        f"  {p.updates} update(s): {p.inserts} row(s) inserted, {p.retractions} retracted, {p.errors} error update(s)"
    )
    _print_feed(p.feed)
    _print_guard(guard)
    print("sample:" if p.rows else "  (nothing to write)")
    print_rows(p.rows, p.updates)


def _print_spark_correction(title: str, corr, guard: str | None, partitions: int, limit: int) -> None:
    """``dry-run``'s report of Spark's correction: Spark shows its frames."""
    print(f"{title}:")
    corr.per_part.show(partitions, truncate=False)
    _print_guard(guard)
    _print_feed(corr.feed)
    print("sample:")
    corr.rows.show(limit, truncate=False)


def _print_feed(feed: FeedProgress | None) -> None:
    if feed is not None:
        print(
            f"upsert feed: {feed.commands} command(s) eligible, {feed.late_commands} late, "
            f"feed read up to offset {feed.source_offset}"
        )


def _print_guard(line: str | None) -> None:
    if line:
        print(f"  {line}")


def cmd_run(args) -> int:
    """One batch without Airflow: mint, write and append in this process."""
    from reconcile.config_loading import load_sink
    from reconcile.errors import DescriptionOutdated
    from reconcile.schedule import now_ms
    from reconcile.sink.run import run_batch

    cfg = load_sink(args.sink)
    ledger = _ledger()
    frontier = now_ms() if args.frontier is None else parse_time(args.frontier, "--frontier")
    run_id = args.run_id or f"cli__{frontier}"
    try:
        r = run_batch(
            quiet_spark("run", f"reconcile-run-{cfg.name}"),
            ledger,
            cfg,
            run_id,
            frontier,
            approve=f"{run_id} (reconcile run --approve)" if args.approve else None,
            on_minted=lambda m: print(f"mint: {m.message}", flush=True),
            on_written=lambda w: print(f"write: {w.message}", flush=True),
        )
    except DescriptionOutdated as exc:
        print(f"append: {exc}")
        return 3
    if r.append is not None:
        print(f"append: {r.append.message}")
    return 3 if r.write is not None and r.write.outcome == "outdated" else 0


def cmd_append(args) -> int:
    """The DAG's append task for one run, in this process (no JVM): on-call's rerun."""
    from reconcile.airflow.tasks import commit_for_run
    from reconcile.errors import Retryable

    try:
        approve = f"{args.run_id} (reconcile append --approve)" if args.approve else None
        print(f"append: {commit_for_run(args.sink, args.run_id, args.batch_id, approve)}")
    except Retryable as exc:
        print(f"error (retryable): {exc}", file=sys.stderr)
        return 75
    return 0


def cmd_approve(args) -> int:
    """Let a batch that the correction guard stopped be appended (by its append task's rerun)."""
    import getpass

    from reconcile.config_loading import load_sink

    cfg = load_sink(args.sink)
    b = _ledger().approve(cfg.name, args.batch, args.by or f"{getpass.getuser()} (reconcile approve)")
    print(
        f"approved batch {b.batch_id} [{iso(b.lower)}, {iso(b.upper)}) of run {b.run_id} past the correction guard; "
        f"append it: {remedy.rerun(cfg.name, b.run_id or '', 'append')}"
    )
    return 0


def cmd_check(args) -> int:
    from reconcile.config_loading import load_sink

    if args.all:
        return check_all(args)
    if args.sink is None:
        raise SinkError(
            "name a sink to check, or check every sink with --all", remedy="`python -m reconcile check SINK`."
        )
    return check_one(load_sink(args.sink), _ledger(), args)


def check_all(args) -> int:
    """``check --all``: each sink's check in turn (a line of each sink's findings and its summary),
    then one line of counts; exits with the worst of their exit codes (1 over 4 over 0). An invalid
    sink file is a needs-action line (exit 1)."""
    import contextlib
    import io

    from reconcile.config_loading import load_dir
    from reconcile.config_messages import problems_of

    if args.sink is not None:
        raise SinkError("check --all checks every sink: name no sink", remedy="`python -m reconcile check --all`.")
    if args.deep or args.verify:
        raise SinkError(
            "check --all reads the ledger and the Delta logs only: --deep and --verify read each sink's rows "
            "with Spark, one sink at a time",
            remedy="`python -m reconcile check SINK --verify` for the sinks that need it.",
        )
    configs, errors = load_dir()
    ledger = _ledger()
    codes: dict[str, int] = {}
    try:
        for cfg in configs:
            text = io.StringIO()
            try:
                with contextlib.redirect_stdout(text):
                    codes[cfg.name] = check_one(cfg, ledger, args)
            except SinkError as exc:
                codes[cfg.name] = 2
                text.write(f"error: {exc}\n")
            except Exception as exc:  # noqa: BLE001 - one sink's unreadable log must not stop the others' checks
                codes[cfg.name] = 2
                text.write(f"error: sink {cfg.name!r}: could not be checked: {brief(exc)}\n")
            lines = text.getvalue().splitlines()
            for line in lines[:-1]:
                print(f"{cfg.name}: {line}")
            if lines:
                print(lines[-1])
    finally:
        ledger.dispose()
    for err in errors:
        for problem in problems_of(err):
            print(f"NEEDS ACTION: invalid sink file: {problem}")
    tally = {code: sum(1 for c in codes.values() if c == code) for code in (0, 1, 4, 2)}
    print(
        f"checked {len(codes)} sink(s): {tally[0]} fine, {tally[1]} needing action, {tally[4]} not yet repaired, "
        f"{tally[2]} could not be checked; {len(errors)} invalid sink file(s)"
    )
    found = set(codes.values()) | ({1} if errors else set())
    return 1 if 1 in found else 2 if 2 in found else 4 if 4 in found else 0


def check_one(cfg, ledger, args) -> int:
    """One sink's ``check`` (its lines, its summary last): its exit code."""
    from reconcile.sink import check
    from reconcile.sink.sync import rebuild_lost_ledger, sync
    from reconcile.storage.delta import ShardTable

    table = ShardTable(cfg)
    spark = None
    if args.deep or args.verify:  # the rows themselves (Spark)
        spark = quiet_spark("check")
    rebuild_lost_ledger(ledger, table, cfg.as_of)
    sync(ledger, table)
    report = check.run_check(ledger, cfg, spark=spark if args.deep else None)
    verified = None
    if args.verify:  # the current state, then older batches' history, from their recorded checksums
        checked, verified = check.verify_report(ledger, cfg, spark, strict_history=args.strict_history)
        against, against_source = check.verify_source(ledger, cfg, spark, bool(verified.get("current", 1)))
        for found in (checked, against):
            report.violations += found.violations
            report.findings += found.findings
            report.repairing += found.repairing
    for p in report.violations:
        print(f"VIOLATION {p}")
    for f in report.findings:
        print(f"FINDING {f}")
    for r in report.repairing:
        print(f"NOT YET REPAIRED {r}")
    for line in report.needs_action:
        print(f"NEEDS ACTION: {line}")
    if (n := verified) is not None:
        now = "verifies" if n.get("current", 1) else "does NOT verify"
        print(
            f"verify: the current state {now}; {n['verified']} batch(es) ({n['partitions']} partitions) checked "
            f"against Delta version {n['version']}; {n['not_verifiable']} not verifiable (written before batches "
            f"recorded checksums), {n['before_since']} before since (compacted) (self-consistency: the shard's "
            "checksums against those its batches recorded)"
        )
        print(f"verify: {against_source}")
    print(report.summary(cfg.name))
    return report.exit_code()  # as status's (docs/operating.md, "Exit codes")


def cmd_recover(args) -> int:
    """Make the shard's metadata agree with its Delta log (a lost, restored or ahead ledger)."""
    from reconcile.config_loading import load_sink
    from reconcile.sink.recover import run_recover

    cfg = load_sink(args.sink)
    result = run_recover(_ledger(), cfg, force=args.force)
    print(f"recover: {result.message}")
    return 0


def cmd_rebuild_current(args) -> int:
    """Write the current-state table whole from the shard's latest version."""
    from reconcile.config_loading import load_sink
    from reconcile.errors import SinkError
    from reconcile.sink.current import maintain
    from reconcile.storage.delta import ShardTable

    cfg = load_sink(args.sink)
    if cfg.current is None:
        raise SinkError(
            "keeps no current-state table",
            sink=cfg.name,
            remedy=f"add `current: true` to {cfg.path or 'its sink file'} (docs/configuration.md); the next append creates it.",
        )
    outcome = maintain(_ledger(), cfg, ShardTable(cfg), rebuild="rebuilt on request (rebuild-current)")
    if outcome is None:
        print(f"rebuild-current: {cfg.name} has no shard yet; its first append creates the current-state table")
        return 0
    print(f"rebuild-current: {outcome.message}")
    return 0


def cmd_compact(args) -> int:
    """Advance since and consolidate the history before it (also the DAG's compact task)."""
    from reconcile.config_loading import load_sink
    from reconcile.sink.compact import run_compact

    cfg = load_sink(args.sink)
    since = None if args.since is None else parse_time(args.since, "--since")
    ledger = _ledger()
    spark = quiet_spark("compact", f"reconcile-compact-{cfg.name}")
    result = run_compact(spark, ledger, cfg, since=since, vacuum_files=not args.no_vacuum)
    print(f"compact: {result.message}")
    return 4 if result.outcome == "raced" else 0


def cmd_history(args) -> int:
    """The shard's type-2 history, or (``--sql``) the view that computes it in any engine."""
    from reconcile.config_loading import load_sink
    from reconcile.sink import history, history_print

    cfg = load_sink(args.sink)
    if args.sql:
        print(history.view_sql(cfg, args.dialect, args.location, errors=args.errors))
        return 0
    ledger = _ledger()
    as_of = None
    if args.as_of is not None:
        as_of = parse_time(args.as_of, "--as-of")
        shard = ledger.get_shard(cfg.name)
        history.check_time(cfg, shard.since, shard.upper, as_of)  # before starting Spark
    report = history.history_report(
        ledger,
        cfg,
        spark=quiet_spark("history") if args.spark else None,
        errors=args.errors,
        keys=args.key,
        as_of=as_of,
        limit=args.limit,
    )
    if args.json:
        print(history_print.to_json(report))
    else:
        history_print.print_history(cfg, report)
    return 0


def cmd_diff(args) -> int:
    """The consolidated changes between two times."""
    from reconcile.config_loading import load_sink
    from reconcile.sink import history, history_print

    cfg = load_sink(args.sink)
    t1, t2 = parse_time(args.from_, "--from"), parse_time(args.to, "--to")
    ledger = _ledger()
    shard = ledger.get_shard(cfg.name)
    history.check_range(cfg, shard.since, shard.upper, t1, t2)  # before starting Spark
    report = history.diff_report(
        ledger,
        cfg,
        t1,
        t2,
        spark=quiet_spark("diff") if args.spark else None,
        errors=args.errors,
        limit=args.limit,
    )
    if args.json:
        print(history_print.to_json(report))
    else:
        history_print.print_diff(cfg, report)
    return 0


def cmd_spark_server(args) -> int:
    from reconcile import connect_server

    if args.action == "start":
        address = connect_server.start(args.port, args.master, warm=not args.no_warm_up)
        print(
            f"Spark Connect server listening at {address}; run the sink's Spark jobs on it with "
            f"RECONCILE_SPARK_REMOTE={address} (CLI) or a spark_connect Airflow connection (DAGs)"
        )
    elif args.action == "stop":
        print("stopped" if connect_server.stop(args.port) else f"no server started by this command on port {args.port}")
    else:
        print(connect_server.status(args.port))
    return 0


def cmd_sql(args) -> int:
    """Spark SQL on the sinks' tables by name (``<database>.<sink>``, ``<database>.<sink>_log``):
    a consumer's session (:func:`reconcile.spark.consumer_session`). The statements given, else
    those read from standard input (``;`` ends one; a prompt when it is a terminal). A result's
    rows are printed tab-separated under its column names; a statement Spark refuses is one
    line on standard error (exit 1), the next ones still run."""
    from reconcile import settings
    from reconcile.spark import consumer_session

    if settings.spark_remote():
        spark = consumer_session()
    else:
        from reconcile.preflight import QUIET_JAVA_OPTIONS, jvm_output_to
        from reconcile.spark import LOG4J2_PROPERTIES

        log = spark_log("sql")
        try:
            with jvm_output_to(log):
                spark = consumer_session(
                    extra={"spark.driver.extraJavaOptions": QUIET_JAVA_OPTIONS.format(log4j=LOG4J2_PROPERTIES)}
                )
        except Exception as exc:
            raise SinkError(
                f"Spark did not start for sql: {brief(exc)} (Spark's log: {log})",
                remedy="check Java (JAVA_HOME) and RECONCILE_SPARK_REMOTE.",
            ) from None
    tty = not args.statements and sys.stdin.isatty()
    status = 0
    for statement in split_sql(" ".join(args.statements)) if args.statements else read_sql(sys.stdin, tty):
        try:
            frame = spark.sql(statement)
            rows = frame.collect() if frame.columns else []
        except Exception as exc:  # noqa: BLE001 - Spark's refusal of a statement: its message, one line
            print(f"error: {brief(exc, 500)}", file=sys.stderr)
            status = 1
            continue
        if frame.columns:
            print("\t".join(frame.columns))
            for row in rows:
                print("\t".join("NULL" if v is None else str(v) for v in row))
        sys.stdout.flush()
    return status


def split_sql(text: str) -> list[str]:
    """The statements of ``text``, split at each ``;`` outside quotes and comments."""
    out, current, quote, i = [], [], "", 0
    while i < len(text):
        ch = text[i]
        if quote:
            current.append(ch)
            if ch == quote:
                quote = ""
        elif ch in "'\"`":
            quote = ch
            current.append(ch)
        elif text.startswith("--", i):
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        elif ch == ";":
            out.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    out.append("".join(current))
    return [s.strip() for s in out if s.strip()]


def read_sql(stream, prompt: bool):
    """The statements of ``stream`` as each is complete (a prompt on a terminal)."""
    pending = ""
    while True:
        if prompt:
            print("spark-sql> " if not pending.strip() else "         > ", end="", flush=True)
        line = stream.readline()
        if not line:
            break
        pending += line
        parts = split_sql(pending + "\n")
        if pending.rstrip().endswith(";") and parts:
            yield from parts
            pending = ""
    yield from split_sql(pending)


def cmd_demo(args) -> int:
    from reconcile.demo import run_demo

    return run_demo(intervals=args.intervals)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="reconcile", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate")
    v.add_argument("--dir", default=None)
    v.add_argument("--no-spark", action="store_true", help="skip planning the query sinks' SQL (no JVM)")
    v.set_defaults(fn=cmd_validate)
    sub.add_parser("schema").set_defaults(fn=cmd_schema)
    d = sub.add_parser("db")
    d.add_argument("action", choices=["upgrade", "downgrade", "current"])
    d.add_argument("revision", nargs="?")
    d.set_defaults(fn=cmd_db)
    s = sub.add_parser("status", help="one sink's status; without a sink, every sink's state (needing action first)")
    s.add_argument("sink", nargs="?", default=None, help="the sink (none: every sink, one line each)")
    s.add_argument("--limit", type=int, default=10)
    s.add_argument("--json", action="store_true", help="machine-readable: times as ms and ISO UTC")
    s.set_defaults(fn=cmd_status)
    sh = sub.add_parser("show")
    sh.add_argument("sink")
    sh.add_argument("--as-of", default=None, help="T (ms or ISO; default upper - 1)")
    sh.add_argument("--log", action="store_true", help="the update log (row, _error, _time, _diff) instead")
    sh.add_argument("--errors", action="store_true", help="the error rows instead")
    sh.add_argument("--limit", type=int, default=50)
    sh.add_argument("--json", action="store_true", help="machine-readable: times as ms and ISO UTC")
    sh.add_argument(
        "--spark",
        action="store_true",
        help="read with Spark (its JVM's output in a log file) instead of DuckDB over delta-rs",
    )
    sh.set_defaults(fn=cmd_show)
    r = sub.add_parser("read-only")
    r.add_argument("sink")
    r.add_argument("state", choices=["on", "off"])
    r.set_defaults(fn=cmd_read_only)
    dr = sub.add_parser("dry-run")
    dr.add_argument("sink")
    dr.add_argument("--frontier", default=None, help="the batch's upper (ms or ISO); default the next scheduled run's")
    dr.add_argument("--limit", type=int, default=20)
    dr.add_argument("--spark", action="store_true", help="compute it with Spark, as the run does")
    dr.set_defaults(fn=cmd_dry_run)
    rn = sub.add_parser("run")
    rn.add_argument("sink")
    rn.add_argument("--frontier", default=None, help="desired frontier (ms or ISO); default now")
    rn.add_argument("--run-id", default=None)
    rn.add_argument("--approve", action="store_true", help="let the batch past the sink's correction guard")
    rn.set_defaults(fn=cmd_run)
    ap = sub.add_parser("append", help="commit a run's staged batch (the DAG's append task)")
    ap.add_argument("sink")
    ap.add_argument("--run-id", required=True, help="the Airflow run id that minted the batch")
    ap.add_argument("--batch-id", default=None, help="the batch its mint minted (default: the run's newest)")
    ap.add_argument("--approve", action="store_true", help="let the batch past the sink's correction guard")
    ap.set_defaults(fn=cmd_append)
    av = sub.add_parser("approve", help="let a batch the correction guard stopped be appended")
    av.add_argument("sink")
    av.add_argument("batch", help="the batch id (the guard's message and `status` name it)")
    av.add_argument("--by", default=None, help="who approves (default: the OS user)")
    av.set_defaults(fn=cmd_approve)
    ck = sub.add_parser("check")
    ck.add_argument("sink", nargs="?", default=None)
    ck.add_argument("--all", action="store_true", help="check every sink in turn (no --deep/--verify)")
    ck.add_argument(
        "--deep", action="store_true", help="also read the committed rows (Spark): checksums, the kind's invariants"
    )
    ck.add_argument(
        "--verify",
        action="store_true",
        help="recompute each batch's checksums of the shard as of its upper - 1 from the Delta table (Spark)",
    )
    ck.add_argument(
        "--strict-history",
        action="store_true",
        help="with --verify: an older batch's history altered by a foreign write is a violation even once repaired",
    )
    ck.set_defaults(fn=cmd_check)
    rc = sub.add_parser("recover", help="rebuild the shard's metadata from its Delta log")
    rc.add_argument("sink")
    rc.add_argument(
        "--force", action="store_true", help="reset it to the log even if that drops batches the log no longer holds"
    )
    rc.set_defaults(fn=cmd_recover)
    rb = sub.add_parser("rebuild-current", help="write the sink's current-state table whole from the shard")
    rb.add_argument("sink")
    rb.set_defaults(fn=cmd_rebuild_current)
    cp = sub.add_parser("compact")
    cp.add_argument("sink")
    cp.add_argument("--since", default=None, help="new since (ms or ISO); default upper - retention.history_hours")
    cp.add_argument("--no-vacuum", action="store_true", help="leave unreferenced Delta files in place")
    cp.set_defaults(fn=cmd_compact)
    hi = sub.add_parser("history", help="type-2 history: each version with valid_from and valid_to")
    hi.add_argument("sink")
    hi.add_argument("--as-of", default=None, help="only the versions valid at T (ms or ISO; since <= T < upper)")
    hi.add_argument(
        "--key", action="append", default=None, help="COLUMN=VALUE (repeatable), or VALUE for a single upsert key"
    )
    hi.add_argument("--errors", action="store_true", help="the error rows' history (left out otherwise)")
    hi.add_argument("--limit", type=int, default=50)
    hi.add_argument("--json", action="store_true", help="machine-readable: times as ms and ISO UTC")
    hi.add_argument("--sql", action="store_true", help="print the view's SQL instead (Spark, DuckDB or Trino)")
    hi.add_argument("--dialect", choices=["spark", "duckdb", "trino"], default="spark", help="for --sql")
    hi.add_argument("--location", default=None, help="for --sql: the Delta table's location (default: the sink's)")
    hi.add_argument(
        "--spark",
        action="store_true",
        help="read with Spark (its JVM's output in a log file) instead of DuckDB over delta-rs",
    )
    hi.set_defaults(fn=cmd_history)
    df = sub.add_parser("diff", help="the rows added and removed between two times, with counts")
    df.add_argument("sink")
    df.add_argument("--from", dest="from_", required=True, help="T1 (ms or ISO, exclusive; since <= T1)")
    df.add_argument("--to", required=True, help="T2 (ms or ISO, inclusive; T1 < T2 < upper)")
    df.add_argument("--errors", action="store_true", help="the error rows' changes (left out otherwise)")
    df.add_argument("--limit", type=int, default=50)
    df.add_argument("--json", action="store_true", help="machine-readable: times as ms and ISO UTC")
    df.add_argument(
        "--spark",
        action="store_true",
        help="read with Spark (its JVM's output in a log file) instead of DuckDB over delta-rs",
    )
    df.set_defaults(fn=cmd_diff)
    ss = sub.add_parser("spark-server", help="a long-lived Spark Connect server for the Spark jobs")
    ss.add_argument("action", choices=["start", "stop", "status"])
    ss.add_argument("--port", type=int, default=15002)
    ss.add_argument(
        "--master", default=None, help="Spark master of the server (default RECONCILE_SPARK_MASTER or local[*])"
    )
    ss.add_argument("--no-warm-up", action="store_true", help="do not run a throwaway batch on a started server")
    ss.set_defaults(fn=cmd_spark_server)
    sq = sub.add_parser(
        "sql",
        help="Spark SQL on the sinks' tables by name (<database>.<sink>, <database>.<sink>_log): a consumer's session",
    )
    sq.add_argument("statements", nargs="*", help="SQL to run (none: read statements from standard input)")
    sq.set_defaults(fn=cmd_sql)
    dm = sub.add_parser("demo")
    dm.add_argument("--intervals", type=int, default=3)
    dm.set_defaults(fn=cmd_demo)
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except SinkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `status --json | head`: the reader has what it wanted
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
        return 0


if __name__ == "__main__":
    sys.exit(main())
