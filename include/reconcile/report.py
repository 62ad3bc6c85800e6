"""What an operator reads about a shard: its status (frontiers and last batches), its contents as
of a time, and the one way every output writes a time. Used by the CLI, the demo and the pages.

Times: every output shows a time (epoch ms) as ISO UTC with the ms beside it
(``2026-11-24T09:00:00.000Z (1795510800000)``, :func:`reconcile.log.iso`); JSON holds it as
``{"ms": ..., "iso": ...}`` (:func:`stamp`); a page sets the ms in small type
(:func:`iso_parts`); a lag reads ``1d 2h 3m`` (:func:`duration`).
"""

from __future__ import annotations

import json

from reconcile.errors import SinkError
from reconcile.log import iso
from reconcile.manifest import source_versions
from reconcile.sql_names import duckdb_name

# -- times ----------------------------------------------------------------------------------------


def iso_parts(ms: int | None) -> tuple[str, str]:
    """A time as :func:`~reconcile.log.iso` writes it, split into the ISO text and the ``(ms)``."""
    text, _, millis = iso(ms).partition(" ")
    return text, millis


def iso_text(ms: int | None) -> str:
    """The ISO UTC text of a time, without the ms beside it."""
    return iso_parts(ms)[0]


def stamp(ms: int | None) -> dict | None:
    """A time in JSON: ``{"ms": epoch ms, "iso": ISO UTC}`` (None stays None)."""
    return None if ms is None else {"ms": ms, "iso": iso_text(ms)}


def duration(ms: int) -> str:
    """A span of time in whole minutes: ``2h 5m``, or ``1d 2h 5m`` from a day on."""
    minutes = max(0, ms) // 60_000
    days, rest = divmod(minutes, 1440)
    return f"{days}d {rest // 60}h {rest % 60}m" if days else f"{rest // 60}h {rest % 60}m"


# -- status ---------------------------------------------------------------------------------------


def status_data(ledger, name: str, limit: int = 10) -> dict:
    """A shard's frontiers and its last ``limit`` batches (oldest first), as ``status --json``
    prints them: each time as ``{"ms": epoch ms, "iso": ISO UTC}``. Each batch says how it stands
    (``standing``: ``tone`` ok/bad/warn/done and a ``note``, :mod:`reconcile.standing`: a failure
    shows as ``bad`` only while unresolved) and which foreign Delta versions it repaired
    (``foreign_versions``); the shard says which are not yet repaired (``foreign_unrepaired``)
    and, when a superseded run left it behind, which run to clear now (``behind``)."""
    from reconcile import standing as st

    shard = ledger.get_shard(name)
    every = ledger.batches(name)
    shown = every[-limit:]
    foreign, unrepaired = _foreign_of(ledger, name, shown)
    left = st.behind(every, shard.upper)
    out = []
    for b in shown:
        how = st.standing(b, shard.upper)
        out.append(
            {
                "batch_id": b.batch_id,
                "lower": stamp(b.lower),
                "upper": stamp(b.upper),
                "state": b.state,
                "delta_version": b.delta_version,
                "rows_ok": b.rows_ok,
                "rows_err": b.rows_err,
                "rows_net": b.rows_net,
                "drift_rows": b.drift_rows,
                "foreign_versions": [st.foreign_json(f) for f in foreign.get(b.batch_id, [])],
                "late_commands": b.late_commands,
                "source_offset": b.source_offset,
                "sources": source_versions(b.manifest),
                "refresh": refresh_of(b.manifest),
                "failure_kind": b.failure_kind,
                "message": b.message,
                "standing": {"tone": how.tone, "note": how.note, "note_tone": how.note_tone},
                "approved": b.approved,
                "run_id": b.run_id,
                "updated_at": b.updated_at.isoformat() if b.updated_at else None,
            }
        )
    return {
        "sink": name,
        "needs_action": config_problem(name) + needs_action(every, shard.upper, unrepaired),
        "upper": stamp(shard.upper),
        "since": stamp(shard.since),
        "as_of": stamp(shard.as_of),
        "read_only": shard.read_only,
        "delta_version": shard.delta_version,
        "behind": None
        if left is None
        else {
            "batch_id": left.batch_id,
            "run_id": left.run_id,
            "from": stamp(left.lower),
            "to": stamp(left.upper),
            "commands": left.commands(name),
            "line": left.line(name),
        },
        "foreign_unrepaired": None if unrepaired is None else [st.foreign_json(f, why=why) for f, why in unrepaired],
        "current": _current_of(ledger, name),
        "batches": out,
    }


def _current_of(ledger, name: str) -> dict | None:
    """How the sink's current-state table stands (:func:`reconcile.sink.current.describe`); None
    when it keeps none, or its config or tables cannot be read (status answers from the ledger)."""
    from reconcile.config_loading import load_sink
    from reconcile.model import COMMITTED
    from reconcile.sink import current
    from reconcile.storage.delta import ShardTable

    try:
        cfg = load_sink(name)
        d = current.describe(cfg, ShardTable(cfg), ledger.batches(name, (COMMITTED,)))
    except Exception:  # noqa: BLE001 - a missing config or unreadable table
        return None
    if d is not None and d.get("upper") is not None:
        d["upper"] = stamp(d["upper"])
    return d


def config_problem(name: str) -> list[str]:
    """The sink's config file, if it exists but does not load: Airflow has no DAG for the sink
    then (its ``invalid_sink_config__`` placeholder names the field) and no run writes, nor fails
    where the ledger could record it. [] when it loads or there is no file of that name."""
    from pathlib import Path

    from reconcile.config_loading import load_sink
    from reconcile.errors import ConfigError

    try:
        load_sink(name)
    except ConfigError as exc:
        if Path(exc.path).stem == name:
            return [
                f"the sink's config does not load, so Airflow runs no DAG {name} (it shows "
                f"invalid_sink_config__{name} instead) and nothing is written: {exc}"
            ]
    except Exception:  # noqa: BLE001 - status answers from the ledger whatever the sinks folder holds
        pass
    return []


def needs_action(every: list, shard_upper: int, unrepaired) -> list[str]:
    """What someone must act on now (``status`` and ``check`` exit 1 while there is any,
    :func:`exit_code`): a batch's failure that no retry resolves
    (:func:`reconcile.standing.standing`), a foreign write the feed cannot repair. (A shard a
    superseded run left behind is not: the next run appends the rest.)"""
    from reconcile import standing as st

    out = []
    for b in every:
        how = st.standing(b, shard_upper)
        if how.unresolved:
            out.append(f"batch {b.batch_id} [{iso(b.lower)}, {iso(b.upper)}): {how.note}")
    for f, why in unrepaired or []:
        if not repairs_itself(why):
            out.append(f"foreign Delta version {f.version}: {why}")
    return out


# The exit codes `status SINK` and `check SINK` share (docs/operating.md, "Exit codes"); 2 is a
# command that could not answer (its one-line error on stderr).
EXIT_OK = 0  # nothing wrong that the command knows of
EXIT_NEEDS_ACTION = 1  # needs_action's lines, or (check) an invariant violation
EXIT_REPAIRS_ITSELF = 4  # the shard differs from what its batches committed; the next batch repairs it


def repairs_itself(why: str) -> bool:
    """Is a foreign version not yet repaired one the next batch repairs (its ``why``,
    :class:`reconcile.standing.Fate`), not one that needs the feed's commands back?"""
    return not why.startswith("not repairable")


def exit_code(needs: list, unrepaired) -> int:
    """``status``'s and ``check``'s exit code: :data:`EXIT_NEEDS_ACTION` while anything is in
    ``needs`` (:func:`needs_action`'s lines; ``check`` adds its violations), else
    :data:`EXIT_REPAIRS_ITSELF` while a foreign version in ``unrepaired`` (``(version, why)``
    pairs) waits for the next batch, else :data:`EXIT_OK`."""
    if needs:
        return EXIT_NEEDS_ACTION
    if any(repairs_itself(why) for _, why in unrepaired or []):
        return EXIT_REPAIRS_ITSELF
    return EXIT_OK


def foreign_unrepaired(ledger, name: str, limit: int = 10) -> list[dict] | None:
    """``status --json``'s ``foreign_unrepaired`` alone, for the pages: the foreign Delta versions
    no committed batch repaired yet, each with ``why`` (None: the config or log is unreadable)."""
    from reconcile import standing as st

    shown = ledger.batch_page(name, limit=limit)[::-1]  # the newest batches, by the keyset index
    unrepaired = _foreign_of(ledger, name, shown)[1]
    return None if unrepaired is None else [st.foreign_json(f, why=why) for f, why in unrepaired]


def _foreign_of(ledger, name: str, shown: list) -> tuple[dict, list | None]:
    """({batch id: foreign versions it repaired} for the committed batches among ``shown``, the
    foreign versions after the last committed batch's read: not yet repaired), from the Delta log's
    commit files after the version the committed batch before ``shown`` read. ({}, None) when
    the sink's config or its Delta table cannot be read (status still answers from the ledger)."""
    from reconcile import standing as st
    from reconcile.config_loading import load_sink
    from reconcile.model import COMMITTED
    from reconcile.storage.delta import ShardTable

    committed = [b for b in shown if b.state == COMMITTED]
    try:
        table = ShardTable(load_sink(name))
        if not table.exists():
            return {}, []
        first = min((b.lower for b in shown), default=None)
        before = ledger.previous_committed(name, first) if first is not None else None
        base = -1 if before is None or before.read_version is None else before.read_version
        found = st.with_rows(table, table.foreign_commits(base, table.latest_version()))
    except Exception:  # noqa: BLE001 - a missing config or unreadable log leaves status to the ledger
        return {}, None
    if not found:
        return {}, []
    from reconcile import kinds

    everything = ledger.batches(name, (COMMITTED,))
    fate = st.fates(everything, found, kinds.repairs_by_key(table.cfg))
    by_batch = st.foreign_by_batch(fate, found)
    shown_ids = {b.batch_id for b in committed}
    by_batch = {k: v for k, v in by_batch.items() if k in shown_ids}
    return by_batch, [(f, fate[f.version].why) for f in found if not fate[f.version].repaired]


def print_status(data: dict) -> None:
    """``status``'s text of :func:`status_data`."""
    name = data["sink"]
    print(
        f"shard {name}: upper={iso(data['upper']['ms'])} "
        f"since={iso(data['since']['ms']) if data['since']['ms'] else 'never compacted'} "
        f"as_of={iso(data['as_of']['ms'])} read_only={data['read_only']} delta_version={data['delta_version']}"
    )
    batches = data["batches"]
    feed = any(b["source_offset"] is not None or b["late_commands"] is not None for b in batches)

    def cell(v, width: int) -> str:
        return f"{'-' if v is None else v!s:>{width}}"

    if batches:
        print(
            f"  {'lower (UTC, ms)':<40} {'upper (UTC, ms)':<40} {'state':<10} {'version':>7} {'ok':>6} {'err':>5} "
            f"{'drift':>6}" + (f" {'late':>5} {'offset':>10}" if feed else "") + "  run / cause"
        )
    label = {"bad": "FAILED, needs action: ", "warn": "", "done": "", "ok": ""}
    for b in batches:
        print(
            f"  {iso(b['lower']['ms']):<40} {iso(b['upper']['ms']):<40} {b['state']:<10} {cell(b['delta_version'], 7)} "
            f"{cell(b['rows_ok'], 6)} {cell(b['rows_err'], 5)} {cell(b['drift_rows'], 6)}"
            + (f" {cell(b['late_commands'], 5)} {cell(b['source_offset'], 10)}" if feed else "")
            + f"  {b['run_id']}"
        )
        how = b["standing"]
        if how["note"]:
            print(f"      {label[how['note_tone']]}{how['note']}")
        read = [f"read {source_text(b['sources'])}"] if b.get("sources") else []
        way = [b["refresh"]["text"]] if b.get("refresh") else []
        if read or way:
            print(f"      {'; '.join(read + way)}")
        for f in b["foreign_versions"]:
            print(f"      repaired foreign Delta version {_foreign_text(f)}")
        if b["approved"]:
            print(f"      approved past the correction guard by {b['approved']}")
    for f in data["foreign_unrepaired"] or []:
        print(f"  foreign Delta version {_foreign_text(f)}: {f.get('why') or 'not yet repaired'}")
    if data["behind"]:
        print(f"  BEHIND: {data['behind']['line']}")
    if (c := data.get("current")) is not None:
        print(f"  {_current_text(name, c)}")
    for line in data["needs_action"]:
        print(f"  NEEDS ACTION: {line}")


def _current_text(name: str, c: dict) -> str:
    head = f"current table {c['name']} ({c['path']}): "
    if not c["exists"]:
        return head + "not created yet (the next append creates it)"
    upper = iso(c["upper"]["ms"]) if c.get("upper") else "no batch"
    text = head + f"reflects shard version {c['shard_version']} (upper {upper}), {c['rows']} rows"
    if c["behind"]:
        text += f"; behind the shard's version {c['shard_latest_version']}: the next append or `recover` completes it"
    if c["foreign_versions"]:
        text += f"; foreign commits {c['foreign_versions']}: the next append rebuilds it"
    return text


def _foreign_text(f: dict) -> str:
    from reconcile.standing import rows_text

    when = f", {iso(f['timestamp'])}" if f["timestamp"] is not None else ""
    return f"{f['version']}: {f['operation']} by {f['engine']}, {rows_text(f)}{when}"


# -- contents -------------------------------------------------------------------------------------


def _name_beside(cfg, base: str) -> str:
    """``base`` prefixed with ``_`` as often as it takes to differ from the sink's columns."""
    taken = {c.lower() for c in cfg.column_names}
    while base.lower() in taken:
        base = "_" + base
    return base


def _contents_duckdb(reader, cfg, t: int | None, *, log: bool, errors: bool, limit: int) -> list[dict]:
    """The rows ``show`` prints (the first ``limit + 1``), by DuckDB over the update log (no JVM)."""
    from reconcile.storage.reads import UPDATES

    cols = ", ".join(duckdb_name(c) for c in cfg.column_names)
    order = ", ".join(f"{duckdb_name(c)} ASC NULLS FIRST" for c in cfg.column_names)
    count = duckdb_name(_name_beside(cfg, "count"))
    if log:
        sql = f'SELECT {cols}, "_error", "_time", "_diff" FROM {UPDATES} ORDER BY "_time" ASC NULLS FIRST, {order}'
    else:
        grouped = (
            f'SELECT {cols}, "_error", CAST(SUM("_diff") AS BIGINT) AS {count} FROM {UPDATES} '
            f'WHERE "_time" <= {int(t or 0)} GROUP BY {cols}, "_error" HAVING SUM("_diff") <> 0'
        )
        if errors:
            sql = f'SELECT "_error", {count} FROM ({grouped}) WHERE "_error" IS NOT NULL ORDER BY "_error", {count}'
        else:
            sql = f'SELECT {cols}, {count} FROM ({grouped}) WHERE "_error" IS NULL ORDER BY {order}'
    return reader.rows(f"{sql} LIMIT {int(limit) + 1}")


def _contents_spark(spark, table, cfg, t: int | None, *, log: bool, errors: bool, limit: int) -> list[dict]:
    """The rows ``show`` prints (the first ``limit + 1``), by Spark (``--spark``)."""
    from pyspark.sql import functions as F

    from reconcile.storage import frames

    def col(c: str):
        return F.col("`" + c.replace("`", "``") + "`").asc_nulls_first()

    count = _name_beside(cfg, "count")
    if log:
        updates = frames.read_updates(spark, table).select(*cfg.column_names, "_error", "_time", "_diff")
        df = updates.orderBy(col("_time"), *[col(c) for c in cfg.column_names])
    else:
        assert t is not None
        ok, errs = frames.read_as_of(spark, table, t)
        if errors:
            df = errs.withColumnRenamed("_count", count).orderBy(col("_error"), col(count))
        else:
            df = ok.withColumnRenamed("_count", count).orderBy(*[col(c) for c in cfg.column_names])
    return [r.asDict() for r in df.limit(limit + 1).collect()]


def shard_contents(
    ledger, cfg, as_of: int | None = None, *, log: bool = False, errors: bool = False, limit: int = 50, spark=None
) -> dict:
    """What ``show`` prints: the shard as of ``as_of`` (default upper - 1; ok rows with their
    count, or ``errors``: the error rows), or (``log``) its update log ordered by time; at most
    ``limit`` rows. Read by DuckDB (no JVM), or by ``spark`` when given: the same rows."""
    from reconcile.model import COMMITTED
    from reconcile.storage.delta import ShardTable
    from reconcile.storage.reads import ShardReader, stamp_note

    table = ShardTable(cfg)
    t = None
    if not log:
        shard = ledger.get_shard(cfg.name)
        t = as_of if as_of is not None else shard.upper - 1
        if t < shard.since:
            raise SinkError(
                f"as of {iso(t)} is before the shard's since {iso(shard.since)}: not readable exactly", sink=cfg.name
            )
    if not table.exists():
        raise SinkError(f"the shard's Delta table at {table.path} has no commits yet", sink=cfg.name)

    def notes(source) -> list[str]:
        if as_of is None or log:
            return []
        batches = [(b.lower, b.upper) for b in ledger.batches(cfg.name, states=(COMMITTED,))]
        return [n for n in [stamp_note(source, batches, "--as-of", as_of)] if n]

    if spark is None:
        with ShardReader(table) as reader:
            rows = _contents_duckdb(reader, cfg, t, log=log, errors=errors, limit=limit)
            said = notes(reader)
    else:
        rows = _contents_spark(spark, table, cfg, t, log=log, errors=errors, limit=limit)
        said = notes(table)
    if log:
        title = f"update log of {cfg.name} (row, _error, _time, _diff):"
    elif errors:
        title = f"errors of {cfg.name} as of {iso(t)}:"
    else:
        title = f"{cfg.name} as of {iso(t)} (count = multiplicity):"
    return {"title": title, "as_of": stamp(t), "notes": said, "rows": rows[:limit], "truncated": len(rows) > limit}


def _text(v) -> str:
    return "null" if v is None else str(v)


def show_shard(
    spark, ledger, cfg, as_of: int | None, *, log: bool, errors: bool, limit: int, as_json: bool = False
) -> None:
    """Print the shard as of ``as_of`` (default upper - 1), its error rows, or its update log
    (:func:`shard_contents`; ``spark`` None: read without a JVM); ``as_json``: the same as one
    JSON document, as ``history --json`` and ``diff --json`` print theirs."""
    data = shard_contents(ledger, cfg, as_of, log=log, errors=errors, limit=limit, spark=spark)
    if as_json:
        print(json.dumps(data, indent=2, default=str))
        return
    print(data["title"])
    for note in data["notes"]:
        print(f"note: {note}")
    if not data["rows"]:
        print("  (no rows)")
        return
    print_rows(data["rows"], len(data["rows"]) + int(data["truncated"]))


def print_rows(rows: list[dict], total: int) -> None:
    """Rows as an aligned table (null as ``null``), and a line saying when ``total`` is more."""
    if not rows:
        return
    header = list(rows[0])
    body = [[_text(r[c]) for c in header] for r in rows]
    widths = [max([len(h)] + [len(line[i]) for line in body]) for i, h in enumerate(header)]
    for line in [header, *body]:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    if total > len(rows):
        print(f"  (first {len(rows)} rows; --limit shows more)")


def refresh_of(manifest: str | None) -> dict | None:
    """The way a query batch took, as its manifest (the ledger's text) records it: ``path``
    (incremental or full), ``why`` (a full comparison's reason) and ``text``, the one short phrase
    status, history, the note and the pages say (None: not recorded)."""
    from reconcile.manifest import Manifest, ManifestUnreadable

    try:
        m = Manifest.from_json(manifest)
    except ManifestUnreadable:
        return None
    if m.refresh is None:
        return None
    return {"path": m.refresh.path, "why": m.refresh.why, "text": m.refresh_text()}


def source_text(versions: dict[str, int]) -> str:
    """The Delta source versions a batch read, as status, history and the pages say them."""
    return ", ".join(f"{name} at version {v}" for name, v in sorted(versions.items()))
