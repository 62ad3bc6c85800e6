"""The current-state table kept in step with the shard (``current:`` in the sink file), in plain
Python: DuckDB computes, pyarrow writes, delta-rs commits (no JVM).

The shard is the update log; the current table holds its collection as of the shard's latest
Delta version as plain rows (each row as many times as its count; error rows are left out: they
are in the shard and in ``status``). :func:`maintain` brings it from the shard version it
reflects (its last commit's application transaction) to the shard's latest:

- **Apply** (the sink's own batch commits since; compactions change no collection and are
  skipped): the batches' rows consolidated per row into a net count. Additions only: one new
  file, nothing read. Retractions: the live rows they match are found (upsert sinks: by the key
  columns only) and marked in their files' deletion vectors (:func:`_mark`), with the additions,
  in one commit; a table without deletion vectors rewrites the files holding them instead
  (copy-on-write).
- **Rebuild** (the first time, ``python -m reconcile rebuild-current``, a foreign commit in the
  shard since, a shard file gone, the shard older than the table says, a foreign commit to the
  current table, a retraction the table cannot match, or the sink file's schema change: its
  columns differ from the file's, or a batch rewrote the shard into them): the whole collection
  from the shard's snapshot, committed as an overwrite. Always in the sink file's columns: while
  the file's schema change waits for its run, the shard's rows are read in them as ``show``
  reads them (:func:`in_file_columns`), and the batch that applies the change goes on from there.

Exactly once: each commit is the version right after the snapshot it was computed from
(put-if-absent) and records the shard version it reflects; a retry, a second attempt or a zombie
computes from what the table says it reflects, so nothing is applied twice or skipped. Commits
are made under the shard's commit lease, fenced right before the put. Readers see the table as
of one shard version or the next, never between. A crash between the shard's commit and this
one leaves the table behind: the next append (a retry, the next run) or ``recover`` completes it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace

from reconcile.config import SinkConfig
from reconcile.errors import Retryable
from reconcile.failpoints import failpoint
from reconcile.log import event
from reconcile.model import Outcome
from reconcile.sql_names import duckdb_name
from reconcile.storage.commits import MAINTENANCE, added_files
from reconcile.storage.current import CurrentTable
from reconcile.storage.delta import ShardTable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CurrentResult:
    """What :func:`maintain` did: UP_TO_DATE, APPLIED or REBUILT (``why``)."""

    outcome: Outcome
    shard_version: int
    rows_added: int = 0
    rows_removed: int = 0
    files_rewritten: int = 0
    why: str = ""
    message: str = ""
    seconds: float = 0.0
    files_marked: int = 0


@dataclass
class _Plan:
    """What one commit to the current table does: files ``added``; files ``removed`` (path,
    size); files ``marked`` with a new deletion vector (path -> size, stats, descriptor); the
    rows it adds and removes."""

    added: list
    removed: list
    rows_added: int
    rows_removed: int
    marked: dict = field(default_factory=dict)
    vectors: dict | None = None  # every file's deletion vector after it (tables that have them)
    before: dict = field(default_factory=dict)  # ... and before it (the snapshot's)


def maintain(ledger, cfg: SinkConfig, table: ShardTable, *, rebuild: str | None = None) -> CurrentResult | None:
    """Bring the sink's current table to the shard's latest version (``rebuild``: why to write it
    whole). None when the sink keeps no current table or has no shard yet."""
    if cfg.current is None or not table.exists():
        return None
    ct = CurrentTable(cfg)
    started = time.perf_counter()
    for _ in range(10):
        outcome = _attempt(ledger, cfg, table, ct, rebuild)
        if outcome is not None:
            return replace(outcome, seconds=round(time.perf_counter() - started, 3))
    raise Retryable(
        f"the current-state table at {ct.path} kept changing while it was brought up to date",
        sink=cfg.name,
        remedy="the task retries by itself; the shard is committed, only its current table waits.",
    )


def _attempt(ledger, cfg: SinkConfig, table: ShardTable, ct: CurrentTable, rebuild: str | None) -> CurrentResult | None:
    if not ct.exists():
        ct.create()
        rebuild = rebuild or "created"
    dt = ct.snapshot()
    latest = table.latest_version()
    reflected = ct.reflected(dt)
    foreign = ct.foreign_versions(dt)
    layout = ct.layout_differences(dt)
    if rebuild is None:
        if reflected is None:
            rebuild = "it reflects no shard version yet"
        elif foreign:
            rebuild = f"foreign commits to it (versions {', '.join(map(str, foreign))}) are undone"
        elif reflected > latest:
            rebuild = f"it reflects shard version {reflected}, past the shard's latest {latest} (restored?)"
        elif layout:
            rebuild = f"its layout differs from the sink file ({'; '.join(layout)})"
    if rebuild is None and reflected == latest:
        return CurrentResult(Outcome.UP_TO_DATE, latest)
    plan: _Plan | str | None = None
    if rebuild is None:
        assert reflected is not None
        plan = _incremental(cfg, table, ct, dt, reflected, latest)
        if isinstance(plan, str):
            rebuild = plan
    if rebuild is not None:
        if _pending(cfg, table.snapshot(latest)):
            rebuild += "; in the sink file's columns, which the shard takes with its next batch"
        plan = _rebuilt(cfg, table, ct, dt, latest)
    assert isinstance(plan, _Plan)
    upper = _upper_at(table, latest, ct, dt, reflected)
    failpoint("current.before_commit")
    meta: dict = {"rows_added": plan.rows_added, "rows_removed": plan.rows_removed}
    if rebuild:
        meta["rebuilt"] = rebuild
    with ledger.commit_lease(cfg.name, f"current-state table to shard version {latest}") as lease:
        if ct.snapshot().version() != dt.version():
            return None  # another writer moved it meanwhile: compute again
        lease.fence()
        if rebuild:  # an overwrite removes every file of the snapshot itself (with its vector)
            version = ct.commit(dt, "overwrite", plan.added, [], {**meta, "vectors": {}}, latest, upper)
        elif plan.marked or (plan.removed and plan.vectors is not None):
            assert plan.vectors is not None
            version = ct.commit_vectors(
                dt, plan.added, plan.marked, plan.removed, plan.before, plan.vectors, meta, latest, upper
            )
        else:
            extra = {} if plan.vectors is None else {"vectors": plan.vectors}
            version = ct.commit(dt, "append", plan.added, plan.removed, {**meta, **extra}, latest, upper)
    if version is None:
        return None
    failpoint("current.after_commit")
    action = Outcome.REBUILT if rebuild else Outcome.APPLIED
    msg = event(
        log,
        f"current-state table {action}" + (f" ({rebuild})" if rebuild else ""),
        sink=cfg.name,
        shard_version=latest,
        current_version=version,
        rows_added=plan.rows_added,
        rows_removed=plan.rows_removed,
        files_rewritten=len(plan.removed),
        files_marked=len(plan.marked),
    )
    return CurrentResult(
        action,
        latest,
        plan.rows_added,
        plan.rows_removed,
        len(plan.removed),
        rebuild or "",
        msg,
        files_marked=len(plan.marked),
    )


def _upper_at(table: ShardTable, latest: int, ct: CurrentTable, dt, reflected: int | None) -> int | None:
    """The upper of the shard's last batch commit at or before ``latest`` (the time the table
    reflects): the log read back from ``latest`` to the first batch commit, or to ``reflected``
    (the snapshot's own upper, when it recorded one); None when the log holds none."""
    known = ct.freshness(dt).get("reconcile.upper")
    for v in range(latest, -1, -1):
        if v == reflected and known is not None:
            return int(known)
        present, meta = table.version_description(v)
        if not present:
            return None
        if meta is not None and meta.get("op") == "batch":
            return int(meta["upper"])
    return None


def _cols(cfg: SinkConfig) -> str:
    return ", ".join(duckdb_name(c) for c in cfg.column_names)


def _match(cfg: SinkConfig, columns: list[str], a: str, b: str) -> str:
    return " AND ".join(f"{a}.{duckdb_name(c)} IS NOT DISTINCT FROM {b}.{duckdb_name(c)}" for c in columns)


def _detect_columns(cfg: SinkConfig) -> list[str]:
    """The columns that find a retracted row's file: an upsert sink's key (one row per key),
    else every column."""
    keys = getattr(cfg, "key_columns", None)
    return list(keys) if keys else cfg.column_names


def _incremental(cfg: SinkConfig, table: ShardTable, ct: CurrentTable, dt, reflected: int, latest: int) -> _Plan | str:
    """The commit that applies the sink's batches since ``reflected``, or why the table must be
    rebuilt instead (a string)."""
    import duckdb

    from reconcile.storage.current import read_parquet

    _, entries = table.history_since(reflected)
    paths: list[str] = []
    for v, meta in entries:
        if meta is None:
            return f"a foreign commit to the shard (version {v}) since shard version {reflected}"
        if meta.get("rekeyed"):  # its files are the whole shard in a new schema, not a change (sink/evolve.py)
            return f"shard version {v} rewrote the shard into the sink file's schema"
        if meta.get("op") in ("compact", MAINTENANCE):
            continue
        if meta.get("op") != "batch":
            return f"shard version {v} is a {meta.get('op')!r} commit"
        paths += [f"{table.path}/{a['path']}" for a in added_files(table.commit_actions(v))]
    try:
        changes = read_parquet(paths, cfg.column_names + ["_diff", "_error"])
    except FileNotFoundError as exc:
        return f"a shard file is gone ({exc})"
    con = duckdb.connect()
    cols = _cols(cfg)
    vectors = ct.vectors(dt) if ct.has_vectors(dt) else None
    if changes is None:
        return _Plan([], [], 0, 0, vectors=vectors)
    con.register("changes", changes)
    con.execute(
        f"CREATE TEMP TABLE net AS SELECT {cols}, sum(_diff)::BIGINT AS _n FROM changes WHERE _error IS NULL "
        f"GROUP BY ALL HAVING sum(_diff) <> 0"
    )
    n_add, n_del = _one(
        con, "SELECT coalesce(sum(_n) FILTER (_n > 0), 0), coalesce(-sum(_n) FILTER (_n < 0), 0) FROM net"
    )
    additions = f"SELECT {cols} FROM net, range(net._n) WHERE net._n > 0"
    if n_del == 0:
        rows = con.execute(additions + _order(cfg)).to_arrow_table()
        return _Plan(ct.write_rows(rows) if rows.num_rows else [], [], int(n_add), 0, vectors=vectors)
    if vectors is not None:
        return _mark(cfg, ct, dt, con, int(n_add), int(n_del), additions, vectors)
    present = ct.data_files(dt)
    detect = _detect_columns(cfg)
    found = read_parquet([f"{ct.path}/{p}" for p, _ in present], detect) if present else None
    if found is None:
        return "a retraction and no row in the current table"
    con.register("found", found)
    touched = [
        r[0]
        for r in con.execute(
            f"SELECT DISTINCT f._file FROM found f SEMI JOIN (SELECT * FROM net WHERE _n < 0) r ON "
            f"{_match(cfg, detect, 'f', 'r')}"
        ).fetchall()
    ]
    rewrite = [present[i] for i in sorted(touched)]
    if detect == cfg.column_names:  # the rows are read already: the touched files' among them
        picked = ", ".join(str(i) for i in touched) or "NULL"
        con.execute(f"CREATE TEMP VIEW old AS SELECT {cols} FROM found WHERE _file IN ({picked})")
    else:
        old_rows = read_parquet([f"{ct.path}/{p}" for p, _ in rewrite], cfg.column_names)
        if old_rows is None:
            return "a retracted row is not in the current table"
        con.register("old", old_rows)
    n_old = _one(con, "SELECT count(*) FROM old")[0]
    con.execute(
        f"CREATE TEMP TABLE kept AS SELECT {cols} FROM old EXCEPT ALL "
        f"SELECT {cols} FROM net, range(-net._n) WHERE net._n < 0"
    )
    kept = _one(con, "SELECT count(*) FROM kept")[0]
    if n_old - kept != n_del:
        return f"{n_del - (n_old - kept)} retracted rows are not in the current table"
    rows = con.execute(f"SELECT * FROM kept UNION ALL {additions}{_order(cfg)}").to_arrow_table()
    return _Plan(ct.write_rows(rows) if rows.num_rows else [], rewrite, int(n_add), int(n_del))


def _mark(
    cfg: SinkConfig, ct: CurrentTable, dt, con, n_add: int, n_del: int, additions: str, vectors: dict
) -> _Plan | str:
    """Retractions as deletion vectors: the live rows that match a retracted row (its key for
    upsert sinks, every column otherwise; as many copies as it retracts) are found by a read of
    those columns with each row's position, and their positions join the file's vector. A file
    with more than half its rows deleted is rewritten with its live rows instead (copy-on-write,
    amortized), so reads never skip more than they return."""

    import numpy as np
    import pyarrow as pa

    from reconcile.storage.current import read_parquet
    from reconcile.storage.deletion_vectors import read, write_file

    listed = ct.files_and_rows(dt)
    present = [(p, size) for p, size, _ in listed]
    rows_of = {p: n for p, _, n in listed}
    detect = _detect_columns(cfg)
    found = read_parquet([f"{ct.path}/{p}" for p, _ in present], detect, positions=True) if present else None
    if found is None:
        return "a retraction and no row in the current table"
    old = read(ct.path, vectors)  # the sink's own vectors (a foreign one means a rebuild)
    index = {p: i for i, (p, _) in enumerate(present)}
    dead = [(index[p], pos) for p, pos in old.items() if p in index]
    con.register(
        "dead",
        pa.table(
            {
                "_file": pa.array(
                    np.concatenate([np.full(len(p), i, np.int32) for i, p in dead] or [np.zeros(0, np.int32)])
                ),
                "_pos": pa.array(np.concatenate([p for _, p in dead] or [np.zeros(0, np.int64)]).astype(np.int64)),
            }
        ),
    )
    con.register("found", found)
    con.execute("CREATE TEMP VIEW live AS SELECT * FROM found ANTI JOIN dead USING (_file, _pos)")
    keys = ", ".join(duckdb_name(c) for c in detect)
    con.execute(f"CREATE TEMP TABLE ret AS SELECT {keys}, sum(-_n) AS _c FROM net WHERE _n < 0 GROUP BY ALL")
    fkeys = ", ".join(f"f.{duckdb_name(c)}" for c in detect)
    picked = con.execute(
        f"SELECT _file, _pos FROM (SELECT f._file, f._pos, r._c, row_number() OVER (PARTITION BY {fkeys} "
        f"ORDER BY f._file, f._pos) AS _rn FROM live f JOIN ret r ON {_match(cfg, detect, 'f', 'r')}) WHERE _rn <= _c"
    ).to_arrow_table()
    if picked.num_rows != n_del:
        return f"{n_del - picked.num_rows} retracted rows are not in the current table"
    files_ = picked.column("_file").to_numpy()
    positions = picked.column("_pos").to_numpy()
    marked: dict[str, object] = {}
    rewrite: list[int] = []
    for i in np.unique(files_):
        path = present[int(i)][0]
        gone = np.union1d(old.get(path, np.zeros(0, np.int64)), positions[files_ == i])
        if 2 * len(gone) > rows_of[path]:
            rewrite.append(int(i))
        else:
            marked[path] = gone
    rows = con.execute(additions).to_arrow_table()
    if rewrite:  # the live rows of the files rewritten, less the ones retracted now
        picked_files = ", ".join(map(str, rewrite))
        con.register("picked", picked)
        if detect == cfg.column_names:
            con.execute(
                f"CREATE TEMP VIEW kept AS SELECT * FROM live ANTI JOIN picked USING (_file, _pos) WHERE _file IN ({picked_files})"
            )
        else:
            whole = read_parquet([f"{ct.path}/{present[i][0]}" for i in rewrite], cfg.column_names, positions=True)
            assert whole is not None
            whole = whole.set_column(
                whole.schema.get_field_index("_file"),
                "_file",
                pa.array(np.asarray(rewrite, np.int32)[whole.column("_file").to_numpy()]),
            )
            con.register("whole", whole)
            con.execute(
                "CREATE TEMP VIEW kept AS SELECT * FROM whole ANTI JOIN dead USING (_file, _pos) ANTI JOIN picked USING (_file, _pos)"
            )
        con.register("additions_rows", rows)
        rows = con.execute(f"SELECT {_cols(cfg)} FROM kept UNION ALL SELECT * FROM additions_rows").to_arrow_table()
    descriptors = write_file(ct.path, marked) if marked else {}
    sizes = dict(present)
    stats = _stats_of([f"{ct.path}/{p}" for p in marked])
    removed = [present[i] for i in rewrite]
    after = {p: d for p, d in vectors.items() if p not in marked and p not in {r for r, _ in removed}}
    after.update(descriptors)
    return _Plan(
        ct.write_rows(rows) if rows.num_rows else [],
        removed,
        n_add,
        n_del,
        marked={p: (sizes[p], stats[f"{ct.path}/{p}"], descriptors[p]) for p in marked},
        vectors=after,
        before=vectors,
    )


def _stats_of(paths: list[str]) -> dict[str, dict]:
    """Delta statistics of each file, from its footer (read in parallel)."""
    from concurrent.futures import ThreadPoolExecutor

    from reconcile.storage import footers

    if not paths:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, len(paths))) as pool:
        return dict(zip(paths, pool.map(footers.file_stats, paths), strict=True))


def _rebuilt(cfg: SinkConfig, table: ShardTable, ct: CurrentTable, dt, latest: int) -> _Plan:
    """The whole collection as of shard version ``latest`` (delta-rs reads the snapshot:
    deletion vectors and column mapping applied), to overwrite the table with."""
    import duckdb

    snap = table.snapshot(latest)
    if _pending(cfg, snap):  # the shard's columns are not the file's: a change no run applies is refused here
        table.check_schema()
    con = duckdb.connect()
    con.register("updates", in_file_columns(cfg, snap, ["_diff", "_error"]))
    cols = _cols(cfg)
    con.execute(
        f"CREATE TEMP TABLE net AS SELECT {cols}, sum(_diff)::BIGINT AS _n FROM updates WHERE _error IS NULL "
        "GROUP BY ALL HAVING sum(_diff) > 0"
    )
    rows = con.execute(f"SELECT {cols} FROM net, range(net._n){_order(cfg)}").to_arrow_table()
    return _Plan(ct.write_rows(rows) if rows.num_rows else [], ct.data_files(dt), rows.num_rows, 0)


def _pending(cfg: SinkConfig, dt) -> bool:
    """Whether the columns of the snapshot ``dt`` are not the sink file's (its schema change waits
    for the run that applies it)."""
    from reconcile.storage import schema_change

    return any(src != name for name, src in schema_change.sources(cfg, dt.schema().to_json()))


def in_file_columns(cfg: SinkConfig, dt, own: list[str]):
    """The rows of the delta-rs snapshot ``dt`` (the shard's, or the current table's) in the sink
    file's columns, then ``own`` as stored (an Arrow table; deletion vectors applied). While the
    file's schema change waits for its run, as the reads see it (:mod:`reconcile.storage.reads`):
    a renamed column read from its old name, an added one null, a dropped one left out, each
    cast to the file's type (a widened one)."""
    import pyarrow as pa

    from reconcile.storage import schema_change

    sources = schema_change.sources(cfg, dt.schema().to_json())
    if all(src == name for name, src in sources):
        return pa.RecordBatchReader.from_stream(dt.scan(columns=cfg.column_names + own)).read_all()
    read = list(dict.fromkeys([src for _, src in sources if src is not None] + own))
    got = pa.RecordBatchReader.from_stream(dt.scan(columns=read)).read_all()
    types = CurrentTable(cfg).arrow_schema()
    cols = [
        got.column(src).cast(types.field(name).type) if src else pa.nulls(got.num_rows, types.field(name).type)
        for name, src in sources
    ]
    return pa.table(cols + [got.column(c) for c in own], names=[name for name, _ in sources] + own)


def _one(con, sql: str) -> tuple:
    """The one row of an aggregate query."""
    row = con.execute(sql).fetchone()
    assert row is not None
    return tuple(row)


def _order(cfg: SinkConfig) -> str:
    """Upsert sinks' files are sorted by key (a local change rewrites few files)."""
    keys = getattr(cfg, "key_columns", None)
    return f" ORDER BY {', '.join(duckdb_name(k) for k in keys)}" if keys else ""


def describe(cfg: SinkConfig, table: ShardTable, committed: list) -> dict | None:
    """How the current table stands (``status``): where and under which names, the shard version
    and upper it reflects (``committed``: the ledger's committed batches), the shard's latest
    version, and foreign commits to it not yet undone. None when the sink keeps none."""
    if cfg.current is None:
        return None
    ct = CurrentTable(cfg)
    out: dict = {"path": ct.path, "name": catalog_names(cfg)[0], "log_name": catalog_names(cfg)[1]}
    if not ct.exists():
        return {**out, "exists": False, "shard_version": None, "upper": None, "behind": table.exists()}
    dt = ct.snapshot()
    v = ct.reflected(dt)
    latest = table.latest_version() if table.exists() else None
    uppers = [b.upper for b in committed if b.delta_version is not None and v is not None and b.delta_version <= v]
    return {
        **out,
        "exists": True,
        "layout_differences": ct.layout_differences(dt),
        "shard_version": v,
        "upper": max(uppers) if uppers else None,
        "shard_latest_version": latest,
        "behind": v is None or (latest is not None and v < latest),
        "foreign_versions": ct.foreign_versions(dt),
        "rows": _live_rows(ct, dt),
    }


def _live_rows(ct: CurrentTable, dt) -> int:
    """The rows of a snapshot: its files' rows less the ones the sink's deletion vectors delete
    (their cardinalities, recorded by its last commit; no vector is read)."""

    stored = sum(n for _, _, n in ct.files_and_rows(dt))
    return stored - sum(int(d["cardinality"]) for d in ct.vectors(dt).values())


def catalog_names(cfg: SinkConfig) -> tuple[str, str]:
    """The names SQL users reach the tables by: ``<database>.<sink>`` (the current state) and
    ``<database>.<sink>_log`` (the shard's update log)."""
    db = cfg.current.database if cfg.current is not None else "reconcile"
    return f"{db}.{cfg.name}", f"{db}.{cfg.name}_log"


def findings(cfg: SinkConfig, table: ShardTable, committed: list, *, deep: bool = False) -> tuple[list[str], list[str]]:
    """(violations, findings) of ``check`` about the current table. Findings: it lags the shard
    (the next append or ``recover`` completes it), a foreign commit to it, or a layout other
    than its sink file's (deletion vectors, NOT NULL: the next append rebuilds it). A violation: while it claims to reflect shard version ``v``, its rows differ
    from the shard's collection at ``v``: by row count (``deep``: by a checksum of every row,
    DuckDB over both tables)."""
    d = describe(cfg, table, committed)
    if d is None:
        return [], []
    name = f"current-state table {d['name']} ({d['path']})"
    if not d["exists"]:
        return [], ([f"{name} does not exist yet; the next append creates it"] if d["behind"] else [])
    found: list[str] = []
    bad: list[str] = []
    if d["foreign_versions"]:
        found.append(
            f"{name}: foreign commits (versions {', '.join(map(str, d['foreign_versions']))}) changed it; the next "
            f"append rebuilds it from the shard (now: `python -m reconcile rebuild-current {cfg.name}`)"
        )
    if d["layout_differences"]:
        found.append(
            f"{name}: its layout differs from the sink file ({'; '.join(d['layout_differences'])}); the next "
            f"append rebuilds it in the sink file's (now: `python -m reconcile rebuild-current {cfg.name}`)"
        )
    if d["behind"]:
        found.append(
            f"{name} reflects shard version {d['shard_version']}, the shard is at {d['shard_latest_version']}: the "
            f"next append or `python -m reconcile recover {cfg.name}` completes it"
        )
    if d["shard_version"] is None or d["foreign_versions"]:
        return bad, found
    want_rows, want_sum = _shard_totals(cfg, table, d["shard_version"], deep)
    if want_rows != d["rows"]:
        bad.append(
            f"{name} holds {d['rows']} rows, the shard as of its version {d['shard_version']} holds {want_rows} "
            f"(`python -m reconcile rebuild-current {cfg.name}` writes it anew)"
        )
    elif deep and _current_sum(cfg) != want_sum:
        bad.append(
            f"{name} differs from the shard as of version {d['shard_version']} (row checksums differ; "
            f"`python -m reconcile rebuild-current {cfg.name}` writes it anew)"
        )
    return bad, found


def _hash_total(con, cfg: SinkConfig, table: str, weight: str = "1", where: str = "TRUE") -> int:
    """The sum of the rows' hashes times ``weight`` modulo 2^64 (two 32-bit limbs, exact)."""
    h = f"hash({_cols(cfg)})"
    lo, hi = _one(
        con,
        f"SELECT coalesce(sum(({h} % 4294967296)::HUGEINT * {weight}), 0), "
        f"coalesce(sum(({h} // 4294967296)::HUGEINT * {weight}), 0) FROM {table} WHERE {where}",
    )
    return (int(lo) + (int(hi) << 32)) % (1 << 64)


def _shard_totals(cfg: SinkConfig, table: ShardTable, version: int, deep: bool) -> tuple[int, int | None]:
    """(rows of the collection, and with ``deep`` the sum of their row hashes mod 2^64) of the
    shard at ``version``, error rows left out."""
    import duckdb
    import pyarrow as pa

    snap = table.snapshot(version)
    con = duckdb.connect()
    if deep:
        con.register("updates", in_file_columns(cfg, snap, ["_diff", "_error"]))
    else:
        con.register("updates", pa.RecordBatchReader.from_stream(snap.scan(columns=["_diff", "_error"])).read_all())
    rows = _one(con, "SELECT coalesce(sum(_diff), 0) FROM updates WHERE _error IS NULL")[0]
    if not deep:
        return int(rows), None
    return int(rows), _hash_total(con, cfg, "updates", "_diff", "_error IS NULL")


def _current_sum(cfg: SinkConfig) -> int:
    import duckdb

    con = duckdb.connect()
    con.register("current_rows", in_file_columns(cfg, CurrentTable(cfg).snapshot(), []))
    return _hash_total(con, cfg, "current_rows")
