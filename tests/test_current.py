"""The current-state table (``current:`` in the sink file) equals the shard's collection after every
batch, for every kind; is maintained from the correction only; survives a kill between the
shard's commit and its own; undoes foreign writes to it; and is read by name and by every
reader as a plain table (real Spark, Delta, delta-rs, DuckDB, Polars; the expected contents from
plain-Python models)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from current_readers import READERS, every_reader, readers_saw, rows_of, start_readers, start_run
from helpers import make_sink, model_kv, run_stages, shard_as_of, write_json_rows
from reconcile import cli
from reconcile.model import COMMITTED
from reconcile.sink import current as current_sink
from reconcile.storage.current import CurrentTable
from reconcile.storage.deletion_vectors import file_name
from reconcile.storage.delta import ShardTable
from upsert_model import HINT, UpsertModel, cmd, upsert_sink

ROOT = Path(__file__).resolve().parents[1]


def current_rows(cfg) -> Counter:
    """The current table's rows as a multiset of tuples (delta-rs, not the sink's reader)."""
    from deltalake import DeltaTable

    from reconcile import settings

    dt = DeltaTable(CurrentTable(cfg).path, storage_options=settings.delta_storage_options())
    table = pa.RecordBatchReader.from_stream(dt.scan()).read_all()  # deletion vectors applied
    assert table.column_names == cfg.column_names, "a plain table: the sink's columns only"
    return Counter(tuple(r[c] for c in cfg.column_names) for r in table.to_pylist())


def as_rows(expected: Counter) -> Counter:
    """A shard-as-of multiset ((row..., error) -> n) as the current table holds it: no error rows."""
    return Counter({k[:-1]: n for k, n in expected.items() if k[-1] is None and n > 0})


def table_layout(path: str) -> tuple[dict, list[dict], dict]:
    """(protocol, schema fields, table properties) as the table's ``_delta_log`` says them: the
    last ``protocol`` and ``metaData`` actions of its commit files (every version is kept here)."""
    from reconcile.storage import files

    protocol: dict = {}
    meta: dict = {}
    for name in sorted(n for n in files.list_names(f"{path}/_delta_log") if n.endswith(".json")):
        for line in (files.read_text(f"{path}/_delta_log/{name}") or "").splitlines():
            action = json.loads(line)
            protocol = action.get("protocol", protocol)
            meta = action.get("metaData", meta)
    return protocol, json.loads(meta["schemaString"])["fields"], meta["configuration"]


DV_PROTOCOL = {
    "minReaderVersion": 3,
    "minWriterVersion": 7,
    "readerFeatures": ["deletionVectors"],
    "writerFeatures": ["deletionVectors", "domainMetadata", "invariants"],
}
PLAIN_PROTOCOL = {"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["domainMetadata", "invariants"]}


def assert_declares_what_it_uses(spark, cfg, vectors: bool) -> None:
    """The current table's protocol holds deletion vectors only where they are on, and nothing
    without a use (no variant type, no column invariants); its schema says NOT NULL where the
    sink file does (``nullable: false``, an upsert key: Delta's ``invariants``), as delta-rs and
    Spark read it."""
    from deltalake import DeltaTable

    from reconcile import settings

    path = CurrentTable(cfg).path
    protocol, fields, conf = table_layout(path)
    assert protocol == (DV_PROTOCOL if vectors else PLAIN_PROTOCOL)
    assert conf.get("delta.enableDeletionVectors") == ("true" if vectors else None)
    keys = set(getattr(cfg, "key_columns", None) or ())
    want = [(c.name, c.nullable and c.name not in keys) for c in cfg.columns]
    assert [(f["name"], f["nullable"]) for f in fields] == want and any(not n for _, n in want)
    schema = DeltaTable(path, storage_options=settings.delta_storage_options()).schema()
    assert [(f.name, f.nullable) for f in schema.fields] == want
    spark_path = path.replace("s3://", "s3a://")
    assert [(f.name, f.nullable) for f in spark.read.format("delta").load(spark_path).schema.fields] == want


def freshness_by_duckdb(cfg) -> dict:
    """The docs' DuckDB query of the current table's freshness (its domain metadata)."""
    import duckdb
    from duckdb_extensions import import_extension

    con = duckdb.connect()
    import_extension("delta", con=con)
    con.sql("LOAD delta")
    path = CurrentTable(cfg).path
    if path.startswith("s3://"):  # docs/object-stores.md's secret
        import_extension("httpfs", con=con)
        con.sql("LOAD httpfs")
        endpoint = os.environ["AWS_ENDPOINT_URL"]
        con.sql(
            f"CREATE SECRET warehouse (TYPE s3, KEY_ID '{os.environ['AWS_ACCESS_KEY_ID']}', "
            f"SECRET '{os.environ['AWS_SECRET_ACCESS_KEY']}', REGION '{os.environ['AWS_REGION']}', "
            f"ENDPOINT '{endpoint.split('://')[1]}', URL_STYLE 'path', USE_SSL {endpoint.startswith('https')})"
        )
    row = con.sql(
        f"SELECT configuration->>'shardVersion', configuration->>'upper', configuration->>'upperUtc' "
        f"FROM delta_domain_metadata('{path}') WHERE domain = 'reconcile'"
    ).fetchone()
    assert row is not None
    return {"shardVersion": int(row[0]), "upper": int(row[1]), "upperUtc": row[2]}


def utc_text(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def reflected(cfg) -> int | None:
    ct = CurrentTable(cfg)
    return ct.reflected(ct.snapshot())


QUERY_ROWS = [
    [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"k": 2, "v": "b"}, {"k": 3, "v": None}],
    [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"k": 3, "v": None}, {"k": 4, "v": "d"}],  # one copy retracted
    [{"k": 1, "v": "A"}, {"k": 2, "v": "b"}, {"k": 4, "v": "d"}, {"k": 4, "v": "d"}, {"k": 5, "v": "e"}],
    [{"k": 1, "v": "A"}, {"k": None, "v": "err"}, {"k": 6, "v": "f"}],  # an error row stays in the shard
    [{"k": 0, "v": "skip"}],  # the query's result is empty
    [{"k": 7, "v": "g"}],
]
SKIPPING = {
    "sources": {"src": {"format": "json", "path": "src"}},
    "sql": "SELECT k, v FROM src WHERE v IS NULL OR v <> 'skip'",
}


def kept(rows: list[dict]) -> list[dict]:
    """The rows the query keeps and the sink can store (a null key is an error row)."""
    return [r for r in rows if r["k"] is not None and r["v"] != "skip"]


@pytest.fixture(params=["local"])
def where(request):
    request.getfixturevalue("warehouse" if request.param == "local" else "s3_warehouse")
    return request.param


@pytest.mark.parametrize(
    "where, vectors",
    [
        pytest.param("local", True, marks=pytest.mark.slow),  # the quick tier keeps the upsert twin
        pytest.param("local", False, marks=pytest.mark.slow),
        ("s3", True),
    ],
    indirect=["where"],
    ids=["local", "local-cow", "s3"],
)
def test_query_sink_current_table_follows_every_batch(spark, where, vectors, tmp_path, sqlite_ledger):
    cfg = make_sink(
        tmp_path, "cur_q", current={"deletion_vectors": vectors}, query=SKIPPING, retention={"vacuum_hours": 0}
    )
    frontier = 100
    marked = rewritten = 0
    for i, rows in enumerate(QUERY_ROWS):
        write_json_rows(tmp_path / "src", rows)
        frontier += 100
        _, _, appended = run_stages(spark, sqlite_ledger, cfg, f"r{i}", frontier)
        assert appended.current is not None
        want = as_rows(model_kv(kept(rows)))
        assert current_rows(cfg) == as_rows(shard_as_of(cfg, frontier - 1)) == want, f"batch {i}"
        assert reflected(cfg) == ShardTable(cfg).latest_version()
        # its freshness, read from the table itself: the shard version and the batch's upper
        fresh = {"shardVersion": reflected(cfg), "upper": frontier, "upperUtc": utc_text(frontier)}
        assert freshness_by_duckdb(cfg) == fresh
        marked += appended.current.files_marked
        rewritten += appended.current.files_rewritten if i else 0
        if i == 0:
            assert appended.current.outcome == "rebuilt"
        elif i == 4:  # everything retracted
            assert appended.current.outcome == "applied" and appended.current.rows_added == 0
    # retractions mark rows (deletion vectors) or rewrite the files they fall in (copy-on-write)
    assert marked > 0 if vectors else (marked == 0 and rewritten > 0)
    assert_declares_what_it_uses(spark, cfg, vectors)
    # ... and by Spark SQL (the docs' query), as table properties
    spark_path = CurrentTable(cfg).path.replace("s3://", "s3a://")
    shown = {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{spark_path}`").collect()}
    assert {k: v for k, v in shown.items() if k.startswith("reconcile.")} == {
        "reconcile.shardVersion": str(reflected(cfg)),
        "reconcile.upper": str(frontier),
        "reconcile.upperUtc": utc_text(frontier),
    }
    # an unchanged source: an empty batch, nothing rewritten
    _, _, appended = run_stages(spark, sqlite_ledger, cfg, "same", frontier + 100)
    assert appended.current.files_rewritten == 0 and appended.current.rows_added == 0
    # the vacuum deletes the files the current table's log removed, and nothing it names
    from reconcile.sink import compact
    from reconcile.storage import files

    ct = CurrentTable(cfg)
    dt = ct.snapshot()
    named = {p for p, _ in ct.data_files(dt)} | {file_name(d) for d in ct.vectors(dt).values()}
    assert set(files.list_files(ct.path)) - named - {p for p in files.list_files(ct.path) if p.startswith("_delta_log")}
    compact.vacuum(sqlite_ledger, ShardTable(cfg))
    assert {p for p in files.list_files(ct.path) if not p.startswith("_delta_log")} == named
    assert current_rows(cfg) == as_rows(model_kv(kept(QUERY_ROWS[-1])))


@pytest.mark.slow  # the quick tier keeps the query sink's current table and the foreign writes
@pytest.mark.parametrize("where", ["local", "s3"], indirect=True)
def test_upsert_sink_current_table_holds_one_row_per_key(spark, where, tmp_path, sqlite_ledger, monkeypatch):
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = upsert_sink(
        tmp_path, "cur_u", upsert={"delete": {"column": "op", "values": ["delete"]}}, current={"deletion_vectors": True}
    )
    model = UpsertModel(delete_field="op", delete_values=("delete",))
    feed = [cmd(k, f"v{k}", 110 + k, k, op="set") for k in range(30)]
    frontier = 100
    marked = 0
    for i in range(4):
        lower, upper = frontier, frontier + 100
        off = 100 + 10 * i
        feed += [
            cmd(i, f"u{i}", lower + 5, off + 1, op="set"),
            cmd(i + 10, None, lower + 6, off + 2, op="delete"),
            cmd(i + 40, f"new{i}", lower + 7, off + 3, op="set"),
        ]
        write_json_rows(tmp_path / "feed", feed + [{**HINT, "op": "set"}])
        _, _, appended = run_stages(spark, sqlite_ledger, cfg, f"r{i}", upper)
        marked += appended.current.files_marked
        model.batch(feed, lower, upper)
        frontier = upper
        want = Counter({(k, v): n for (k, v, _), n in model.as_of(upper - 1).items()})
        assert len(want) > 25 and current_rows(cfg) == want, f"batch {i}"
    assert marked >= 3, "each later batch's updates and deletes marked the old rows (deletion vectors)"
    assert_declares_what_it_uses(spark, cfg, True)


@pytest.mark.slow  # a crash test: the quick tier leaves those out
@pytest.mark.parametrize("where", ["local", "s3"], indirect=True)
def test_a_kill_between_the_shard_commit_and_the_current_commit_is_completed(
    spark, where, tmp_path, sqlite_ledger, monkeypatch
):
    """A kill at each of the current table's fail points, on the commit that creates it (delta-rs)
    and on the ones that mark retracted rows (the sink's own deletion vector commits)."""
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = make_sink(tmp_path, "cur_kill", current={"deletion_vectors": True})
    frontier = 100
    points = ["current.before_commit", "current.before_commit", "current.after_commit", None]
    for i, rows in enumerate(QUERY_ROWS[:4]):
        write_json_rows(tmp_path / "src", rows)
        frontier += 100
        point = points[i]
        from reconcile.sink import mint, write

        m = mint.run_mint(sqlite_ledger, cfg, f"k{i}", 1, frontier)
        write.run_write(spark, sqlite_ledger, cfg, m.description.batch_id)
        if point:
            env = {**os.environ, "RECONCILE_FAILPOINTS": f"{point}=kill"}
            proc = subprocess.run(
                [sys.executable, "-m", "reconcile", "append", cfg.name, "--run-id", f"k{i}"],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert proc.returncode == 137, proc.stderr[-2000:]
            shard_version = ShardTable(cfg).latest_version()
            if point == "current.before_commit":  # the shard committed, its current table not yet
                assert reflected(cfg) != shard_version
            # the task's retry completes it (the batch is committed: only the current table moves)
            again = cli.main(["append", cfg.name, "--run-id", f"k{i}"])
            assert again == 0
        else:
            from reconcile.sink import append

            append.run_append(sqlite_ledger, cfg, m.description.batch_id)
        assert reflected(cfg) == ShardTable(cfg).latest_version()
        assert current_rows(cfg) == as_rows(shard_as_of(cfg, frontier - 1))


def test_foreign_writes_are_undone_and_a_lost_current_table_is_rebuilt(
    spark, warehouse, tmp_path, sqlite_ledger, monkeypatch, capsys
):
    from deltalake import DeltaTable, write_deltalake

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = make_sink(tmp_path, "cur_foreign", current={"deletion_vectors": True})
    write_json_rows(tmp_path / "src", QUERY_ROWS[0])
    run_stages(spark, sqlite_ledger, cfg, "r0", 200)
    path = CurrentTable(cfg).path
    # a consumer writes into the current table: deletes a row (a deletion vector of its own), adds
    # one; delta-rs cannot (the table's freshness record is a feature it does not write)
    with pytest.raises(Exception, match="DomainMetadata"):
        write_deltalake(path, pa.table({"k": pa.array([99], pa.int64()), "v": ["zz"]}), mode="append")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE k = 1")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (99, 'zz')")
    assert current_rows(cfg) != as_rows(shard_as_of(cfg, 199))
    capsys.readouterr()
    assert cli.main(["check", cfg.name]) == 0
    out = capsys.readouterr().out
    assert "FINDING current-state table reconcile.cur_foreign" in out and "foreign commits (versions" in out
    assert cli.main(["status", cfg.name, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["current"]
    assert shown["name"] == "reconcile.cur_foreign" and shown["foreign_versions"] and shown["upper"]["ms"] == 200
    from reconcile.airflow import ui

    page = ui.render_sink(cfg.name)
    assert "current table reconcile.cur_foreign" in page and "<span class=bad>foreign commits" in page
    write_json_rows(tmp_path / "src", QUERY_ROWS[1])
    _, _, appended = run_stages(spark, sqlite_ledger, cfg, "r1", 300)
    assert appended.current.outcome == "rebuilt" and "foreign" in appended.current.why
    assert current_rows(cfg) == as_rows(shard_as_of(cfg, 299))
    # a foreign write into the shard: the current table follows the shard, then the repair
    DeltaTable(ShardTable(cfg).path).delete("k = 4")
    out = current_sink.maintain(sqlite_ledger, cfg, ShardTable(cfg))
    assert out.outcome == "rebuilt" and "foreign commit to the shard" in out.why
    assert current_rows(cfg) == as_rows(shard_as_of(cfg, 299))
    run_stages(spark, sqlite_ledger, cfg, "r2", 400)
    assert current_rows(cfg) == as_rows(shard_as_of(cfg, 399)) == as_rows(model_kv(QUERY_ROWS[1]))
    capsys.readouterr()
    assert cli.main(["check", cfg.name]) == 0 and "current-state table" not in capsys.readouterr().out
    # a commit of the sink's own that claims the shard's version but holds other values (a bug)
    ct = CurrentTable(cfg)
    dt = ct.snapshot()
    rows = pa.RecordBatchReader.from_stream(dt.scan()).read_all()
    wrong = rows.set_column(1, "v", pa.array(["wrong"] * rows.num_rows, pa.string()))
    assert ct.commit(dt, "overwrite", ct.write_rows(wrong), [], {}, ct.reflected(dt)) is not None
    assert cli.main(["check", cfg.name]) == 0  # the row count agrees
    assert cli.main(["check", cfg.name, "--deep"]) == 1
    assert "VIOLATION current-state table reconcile.cur_foreign" in capsys.readouterr().out
    # rebuilt by hand, on request
    capsys.readouterr()
    assert cli.main(["rebuild-current", cfg.name]) == 0
    assert "rebuilt on request" in capsys.readouterr().out
    assert current_rows(cfg) == as_rows(model_kv(QUERY_ROWS[1]))
    # a sink without one: one line saying how to keep one
    plain = make_sink(tmp_path, "cur_none")
    assert cli.main(["rebuild-current", plain.name]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "current: true" in err[0] and "Traceback" not in err[0]


@pytest.mark.slow  # twelve batches (the quick tier's readers: test_query_sink_current_table_follows_every_batch)
def test_readers_see_a_plain_table(spark, warehouse, tmp_path, sqlite_ledger, monkeypatch):
    """Spark, Polars, DuckDB and delta-rs read the current table as plain rows, after batches that
    marked rows with deletion vectors (files of 8 rows: several vectors in one commit, and files
    more than half deleted rewritten), past a checkpoint, and after a vacuum at zero retention."""
    import duckdb
    import polars as pl
    from deltalake import DeltaTable, QueryBuilder

    from reconcile.sink import compact
    from reconcile.storage import files

    cfg = make_sink(tmp_path, "cur_read", current={"deletion_vectors": True}, retention={"vacuum_hours": 0})
    monkeypatch.setattr("reconcile.storage.current.ROWS_PER_FILE", 8)
    rows = [{"k": k, "v": f"v{k % 3}"} for k in range(40)]
    marked = rewritten = 0
    for i in range(12):  # each batch retracts two rows and adds one
        if i:
            rows = [r for r in rows if r["k"] not in (i, 39 - i)] + [{"k": 100 + i, "v": "new"}]
        write_json_rows(tmp_path / "src", rows)
        _, _, appended = run_stages(spark, sqlite_ledger, cfg, f"r{i}", 100 * (i + 2))
        marked += appended.current.files_marked
        rewritten += appended.current.files_rewritten if i else 0
        assert current_rows(cfg) == Counter((r["k"], r["v"]) for r in rows), f"batch {i}"
    ct = CurrentTable(cfg)
    path = ct.path
    compact.vacuum(sqlite_ledger, ShardTable(cfg))
    dt = ct.snapshot()
    assert marked >= 12 and rewritten >= 1 and ct.vectors(dt), "rows marked; files half deleted rewritten"
    assert any(".checkpoint." in n for n in files.list_names(f"{path}/_delta_log")), "past a checkpoint"
    want = sorted((r["k"], r["v"]) for r in rows)
    got_spark = sorted(tuple(r) for r in spark.read.format("delta").load(path).collect())
    assert got_spark == want
    got_polars = sorted(pl.read_delta(path).iter_rows())
    assert got_polars == want
    got_delta_rs = QueryBuilder().register("cur", DeltaTable(path)).execute("SELECT k, v FROM cur").read_all()
    assert sorted(zip(*pa.table(got_delta_rs).to_pydict().values(), strict=True)) == want
    from duckdb_extensions import import_extension

    con = duckdb.connect()
    import_extension("delta", con=con)
    con.sql("LOAD delta")
    got_duck = sorted(con.execute(f"SELECT k, v FROM delta_scan('{path}')").fetchall())
    assert got_duck == want
    # a dbt-style downstream model over it
    totals = con.execute(f"SELECT v, count(*) AS n FROM delta_scan('{path}') GROUP BY v ORDER BY v").fetchall()
    assert totals == sorted(Counter(v for _, v in want).items())
    bad, found = current_sink.findings(cfg, ShardTable(cfg), sqlite_ledger.batches(cfg.name, (COMMITTED,)), deep=True)
    assert bad == [] and found == []


@pytest.mark.slow  # three batches and a rebuild (the default layout's readers: tests/test_dbt.py)
def test_a_changed_deletion_vectors_setting_is_applied_without_a_hand(
    spark, warehouse, tmp_path, sqlite_ledger, monkeypatch, capsys
):
    """``deletion_vectors`` changed in the sink file: ``check`` reports the table's other layout,
    the next append applies it (vectors on: rows marked, every reader but delta-rs's
    ``to_pyarrow_table`` reads them), ``rebuild-current`` too (off again: every reader); nothing
    deleted by hand, the rows equal to the model throughout. (The default layout read by every
    reader after updates, deletes and re-inserts: tests/test_dbt.py.)"""
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = make_sink(tmp_path, "cur_dflt", current=True)
    path = CurrentTable(cfg).path
    write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"k": 3, "v": "c"}])
    run_stages(spark, sqlite_ledger, cfg, "d0", 200)
    assert table_layout(path)[0] == PLAIN_PROTOCOL
    # deletion vectors on in the sink file: check says so, the next append applies it
    cfg = make_sink(tmp_path, "cur_dflt", current={"deletion_vectors": True})
    capsys.readouterr()
    assert cli.main(["check", cfg.name]) == 0
    out = capsys.readouterr().out
    assert "its layout differs from the sink file (deletion vectors off, the sink file says on)" in out, out
    rows = [{"k": 1, "v": "A"}, {"k": 2, "v": "b"}, {"k": 4, "v": None}, {"k": 5, "v": "e"}]  # 1 updated, 3 deleted
    write_json_rows(tmp_path / "src", rows)
    _, _, appended = run_stages(spark, sqlite_ledger, cfg, "d1", 300)
    assert appended.current.outcome == "rebuilt" and "layout" in appended.current.why
    assert table_layout(path)[0] == DV_PROTOCOL
    rows = [{"k": 1, "v": "A"}, {"k": 2, "v": "B"}, {"k": 4, "v": None}, {"k": 5, "v": "e"}]  # 2 updated
    write_json_rows(tmp_path / "src", rows)
    _, _, appended = run_stages(spark, sqlite_ledger, cfg, "d2", 400)
    assert appended.current.outcome == "applied" and appended.current.files_marked == 1
    want = Counter((r["k"], r["v"]) for r in rows)
    readers = every_reader(spark, path, ["k", "v"], vectors=True)
    assert readers == dict.fromkeys([r for r in READERS if "to_pyarrow" not in r], want)
    # ... and off again: rebuild-current applies it at once
    cfg = make_sink(tmp_path, "cur_dflt", current=True)
    capsys.readouterr()
    assert cli.main(["rebuild-current", cfg.name]) == 0
    assert "rebuilt on request" in capsys.readouterr().out
    assert table_layout(path)[0] == PLAIN_PROTOCOL
    assert every_reader(spark, path, ["k", "v"]) == dict.fromkeys(READERS, want)
    assert cli.main(["check", cfg.name]) == 0
    assert "current-state table" not in capsys.readouterr().out


def test_a_bad_current_section_is_one_line_naming_the_field(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    make_sink(tmp_path, "cur_ok", current={"path": "marts/orders", "database": "marts"})
    from reconcile.config_loading import load_file

    ok = load_file(tmp_path / "cur_ok.yaml")
    assert ok.current.path == str((tmp_path / "marts" / "orders").resolve())
    assert CurrentTable(ok).path == ok.current.path
    assert current_sink.catalog_names(ok) == ("marts.cur_ok", "marts.cur_ok_log")
    with pytest.raises(Exception):  # noqa: B017 - the loader's own error type, checked by its line below
        make_sink(tmp_path, "cur_bad", current={"paht": "x"})
    capsys.readouterr()
    assert cli.main(["validate"]) != 0
    said = capsys.readouterr()
    lines = [ln for ln in (said.out + said.err).splitlines() if "cur_bad" in ln]
    assert len(lines) == 1 and "current.paht" in lines[0] and "path" in lines[0]


def test_a_consumer_session_uses_a_metastore_service_or_a_catalog_of_its_own(tmp_path, monkeypatch):
    """With a metastore service the consumer's session catalog is that service (the names the
    writes registered); with the embedded default or none, a catalog of its own in memory (the
    sinks registered by location as it starts: tests below), never the writes' Derby database."""
    from reconcile.spark import consumer_conf

    monkeypatch.setenv("RECONCILE_HOME", str(tmp_path))
    monkeypatch.setenv("RECONCILE_METASTORE", "thrift://metastore.internal:9083")
    assert consumer_conf() == {
        "spark.sql.catalogImplementation": "hive",
        "spark.hadoop.hive.metastore.uris": "thrift://metastore.internal:9083",
    }
    for where in ("embedded", "none"):
        monkeypatch.setenv("RECONCILE_METASTORE", where)
        conf = consumer_conf()
        assert conf["spark.sql.catalogImplementation"] == "in-memory" and not any("derby" in v for v in conf.values())


ANALYST = """
import json, pathlib, sys, time
from reconcile.spark import consumer_session
spark = consumer_session("analyst")
stop = pathlib.Path(sys.argv[1])
seen = []
while True:
    done = stop.exists()
    rows = spark.sql("SELECT k, v FROM reconcile.cur_cat").collect()
    seen.append({"at": time.time(), "rows": sorted(([r.k, r.v] for r in rows), key=json.dumps)})
    if done:
        break
    time.sleep(0.5)
# a dbt-style model over the current table, in the session's own catalog
spark.sql("CREATE OR REPLACE TEMPORARY VIEW by_v AS SELECT v, count(*) AS n FROM reconcile.cur_cat GROUP BY v")
out = {
    "seen": seen,
    "log_rows": spark.sql("SELECT count(*) FROM reconcile.cur_cat_log WHERE _diff <> 0").collect()[0][0],
    "model": sorted(([r.v, r.n] for r in spark.table("by_v").collect()), key=json.dumps),
    "tables": sorted(t.name for t in spark.catalog.listTables("reconcile") if not t.isTemporary),
}
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow  # Spark processes of its own: a run, then a run and two readers at once
def test_consumers_read_by_name_at_once_while_a_batch_runs(tmp_path):
    """``reconcile run`` registers the tables in the embedded Derby metastore as it writes. Then,
    while a second run writes its batch (registering again: Derby busy in its JVM), two analysts'
    sessions read both tables by name at once: ``python -m reconcile sql`` and
    ``reconcile.spark.consumer_session()`` (each its own catalog, registered from the sink
    files), never a half-applied state, the batch's rows once it is done."""
    home = tmp_path / "home"
    env = {
        **os.environ,
        "RECONCILE_HOME": str(home),
        "RECONCILE_WAREHOUSE": str(tmp_path / "warehouse"),
        "RECONCILE_METADATA_URL": f"sqlite:///{tmp_path / 'ledger.db'}",
        "RECONCILE_SINKS_DIR": str(tmp_path),
        "RECONCILE_METASTORE": "embedded",
    }
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.pop("RECONCILE_SPARK_REMOTE", None)
    make_sink(tmp_path, "cur_cat", current=True)

    def run(frontier: int, rows: list[dict]) -> subprocess.Popen:
        return start_run(env, "cur_cat", frontier, tmp_path / "src", rows)

    first = run(200, QUERY_ROWS[1])
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, out[-2000:] + err[-2000:]
    lines = [ln.split(":")[0] for ln in out.splitlines() if ln.split(":")[0] in ("mint", "write", "append")]
    assert lines == ["mint", "write", "append"], out  # in the order they happen
    marker = home / "catalog" / "cur_cat.json"
    assert marker.exists() and json.loads(marker.read_text())["metastore"] == "embedded", err[-3000:]
    before, after = rows_of(model_kv(QUERY_ROWS[1])), rows_of(model_kv(QUERY_ROWS[2]))
    marker.unlink()  # the second run registers again: Derby is booted in its JVM while the readers read
    stop = tmp_path / "stop"
    second = run(300, QUERY_ROWS[2])
    readers = start_readers(env, tmp_path, "SELECT k, v FROM reconcile.cur_cat ORDER BY k, v", ANALYST, str(stop))
    said, ended, got = readers_saw(second, readers, stop, before, after)
    assert marker.exists() and "could not register" not in said
    # each run's Spark log is its own (two sessions of a user never share one)
    import tempfile

    logs = [Path(tempfile.gettempdir()) / f"reconcile-run-spark-{os.getuid()}-{p.pid}.log" for p in (first, second)]
    assert all(log.exists() for log in logs) and logs[0] != logs[1]
    assert got["seen"][0]["at"] < ended, "the analyst read while the batch ran"
    assert got["tables"] == ["cur_cat", "cur_cat_log"] and got["log_rows"] >= len(after)
    # the sink started anew (its tables and ledger deleted): the stale names are registered again
    import shutil

    shutil.rmtree(tmp_path / "warehouse")
    (tmp_path / "ledger.db").unlink()
    marker.unlink()
    again = run(200, QUERY_ROWS[1])
    out, err = again.communicate(timeout=600)
    assert again.returncode == 0, err[-2000:]
    assert marker.exists() and "could not register" not in out + err
