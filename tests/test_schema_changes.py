"""A sink whose schema changes (issue 52): ``validate`` says what the next run does, a nullable
column added is applied by one batch (the new schema and the correction it implies in one Delta
version), a change no run applies is refused as the sink file's change, distinct from a change
made to the table behind the sink's back. The shard is checked against a plain-Python model
(``helpers.model_*``), read with delta-rs."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from helpers import as_of, assert_one_line, make_sink, run_stages, update_log, write_json_rows
from reconcile.cli import main
from reconcile.errors import ShardSchemaChanged, SinkSchemaChange, StagedBatchInvalid
from reconcile.storage import schema_change
from reconcile.storage.delta import ShardTable

KV = [{"name": "k", "type": "bigint", "nullable": False}, {"name": "v", "type": "string"}]


def _sink(directory: Path, name: str, schema: list[dict], sql: str = "SELECT k, v FROM src", **fields):
    query = {"sources": {"src": {"format": "json", "path": "src"}}, "sql": sql}
    return make_sink(directory, name, schema=schema, query=query, **fields)


# --- the plan, without a table ------------------------------------------------------------------


def test_widening_is_numeric_and_keeps_every_value():
    assert schema_change.widens("integer", "long") and schema_change.widens("byte", "integer")
    assert schema_change.widens("float", "double")
    assert schema_change.widens("decimal(10,2)", "decimal(12,2)") and schema_change.widens(
        "decimal(10,2)", "decimal(12,4)"
    )
    assert not schema_change.widens("long", "integer")
    assert not schema_change.widens("decimal(10,2)", "decimal(10,4)")  # loses two integer digits
    assert not schema_change.widens("integer", "string") and not schema_change.widens("double", "float")


def test_the_plan_names_each_change(tmp_path):
    table = [("k", "long"), ("v", "string"), ("n", "integer"), ("old", "string"), ("gone", "double")]
    schema = [
        {"name": "k", "type": "bigint", "nullable": False},
        {"name": "v", "type": "string"},
        {"name": "n", "type": "bigint"},
        {"name": "new_name", "type": "string", "renamed_from": "old"},
        {"name": "extra", "type": "int"},
    ]
    plan = schema_change.plan(_sink(tmp_path, "p", schema), table)
    got = {(c.what, c.column, c.old, c.new) for c in plan.changes}
    assert got == {
        ("widened", "n", "integer", "long"),
        ("renamed", "new_name", "old", None),
        ("added", "extra", None, "integer"),
        ("dropped", "gone", None, None),
    }
    assert plan.supported and plan.rewrites and plan.refusal() == ""  # the shard rewritten, then the batch
    assert "10 update rows rewritten" in schema_change.SchemaPlan(plan.changes, 10).cost()
    retyped = schema_change.plan(
        _sink(tmp_path, "p2", [KV[0], {"name": "v", "type": "int"}]), [("k", "long"), ("v", "string")]
    )
    assert not retyped.supported
    assert retyped.refusal() == "column v retyped from string to integer: only numeric widening keeps every value"

    added = schema_change.plan(
        _sink(tmp_path, "q", [*KV, {"name": "extra", "type": "int"}]), [("k", "long"), ("v", "string")]
    )
    assert [c.text() for c in added.changes] == ["column extra integer added"] and added.supported
    assert "0 rows rewritten" in added.cost() and not added.rewrites
    strict = schema_change.plan(
        _sink(tmp_path, "r", [*KV, {"name": "extra", "type": "int", "nullable": False}]),
        [("k", "long"), ("v", "string")],
    )
    assert not strict.supported and "must be nullable" in strict.refusal()
    same = schema_change.plan(_sink(tmp_path, "s", KV), [("k", "long"), ("v", "string")])
    assert not same and same.supported
    # a rename without its declaration is a drop and an add; a declaration naming no column is a note
    undeclared = schema_change.plan(
        _sink(tmp_path, "t", [KV[0], {"name": "w", "type": "string"}]), [("k", "long"), ("v", "string")]
    )
    assert {c.what for c in undeclared.changes} == {"added", "dropped"}
    stale = schema_change.plan(
        _sink(tmp_path, "u", [*KV, {"name": "x", "type": "string", "renamed_from": "nope"}]),
        [("k", "long"), ("v", "string")],
    )
    assert [c.what for c in stale.changes] == ["added"] and "nope is not a column of the shard" in stale.notes[0]


def test_an_upsert_key_change_is_refused_a_new_value_column_applied(tmp_path):
    upsert = {
        "source": {"format": "json", "path": "feed"},
        "key": ["k", "k2"],
        "time_column": "ts",
        "offset_column": "off",
    }
    schema = [*KV, {"name": "k2", "type": "int"}, {"name": "w", "type": "string"}]
    cfg = make_sink(tmp_path, "ups", "upsert", schema=schema, upsert=upsert)
    plan = schema_change.plan(cfg, [("k", "long"), ("v", "string")])
    assert not plan.supported
    assert plan.refusal() == (
        "column k2 integer added: changes the upsert key (each key's history would change meaning): a new sink"
    )
    upsert["key"] = "k"
    cfg = make_sink(tmp_path, "ups2", "upsert", schema=schema, upsert=upsert)
    assert schema_change.plan(cfg, [("k", "long"), ("v", "string")]).supported


# --- validate and the refusals, on a shard's table (delta-rs, no JVM) -------------------------------


def test_validate_says_what_the_next_run_does_and_refuses_the_sink_files_change(tmp_path, warehouse, capsys):
    sinks = tmp_path / "sinks"
    sinks.mkdir()
    for name in ("added", "foreign", "same"):
        ShardTable(_sink(sinks, name, KV)).ensure()
    ShardTable(_sink(sinks, "widened", [*KV, {"name": "n", "type": "int"}])).ensure()
    ShardTable(_sink(sinks, "retyped", [*KV, {"name": "n", "type": "int"}])).ensure()
    _sink(sinks, "retyped", [*KV, {"name": "n", "type": "string"}], sql="SELECT k, v, 'x' AS n FROM src")
    _sink(sinks, "added", [*KV, {"name": "note", "type": "string"}], sql="SELECT k, v, 'x' AS note FROM src")
    _sink(sinks, "widened", [*KV, {"name": "n", "type": "bigint"}], sql="SELECT k, v, CAST(1 AS BIGINT) AS n FROM src")
    _sink(sinks, "newsink", KV)  # no shard yet: nothing to compare
    # another writer adds a column to the table: not the sink file's change
    from deltalake import DeltaTable
    from deltalake.schema import Field, PrimitiveType

    DeltaTable(str(warehouse / "foreign")).alter.add_columns([Field("extra", PrimitiveType("string"), nullable=True)])
    capsys.readouterr()

    assert main(["validate", "--dir", str(sinks), "--no-spark"]) == 1
    out = capsys.readouterr().out
    lines = {line.split(":")[0].split()[-1]: line for line in out.splitlines() if ":" in line}
    assert "schema change applied by the next run in its batch's commit: column note string added" in lines["added"]
    assert "0 rows rewritten" in lines["added"] and "the shard holds 0 update rows" in lines["added"]
    assert (
        "schema change applied by the next run" in lines["widened"]
        and "column n widened from integer to long" in lines["widened"]
    )
    assert "0 update rows rewritten" in lines["widened"]
    assert lines["retyped"].startswith(
        f"INVALID retyped: the sink file {sinks / 'retyped.yaml'} changes the shard's columns"
    )
    assert "column n retyped from integer to string: only numeric widening keeps every value" in lines["retyped"]
    assert lines["foreign"].startswith("INVALID foreign: the shard's Delta table was changed behind the sink's back")
    assert "the sink file against it: column extra dropped" in lines["foreign"] and "RESTORE" in lines["foreign"]
    assert not any(
        line.startswith(("INVALID same", "INVALID newsink", "        same", "        newsink"))
        for line in out.splitlines()
    )
    ok = {line.split()[1] for line in out.splitlines() if line.startswith("ok ")}
    assert ok == {"added", "widened", "same", "newsink"}, out  # a sink its next run refuses is not ok

    # the stages refuse the same way: the sink file's change, or the table's
    with pytest.raises(SinkSchemaChange) as info:
        ShardTable(_sink(sinks, "retyped", [*KV, {"name": "n", "type": "string"}])).ensure()
    text = assert_one_line(info.value, "retyped")
    assert "the sink file" in text and "column n retyped from integer to string" in text and "a new sink" in text
    assert "behind the sink's back" not in text
    with pytest.raises(ShardSchemaChanged) as info:
        ShardTable(_sink(sinks, "foreign", KV)).ensure()
    assert "behind the sink's back" in assert_one_line(info.value, "foreign")
    plan = ShardTable(_sink(sinks, "added", [*KV, {"name": "note", "type": "string"}])).check_schema()
    assert plan and plan.supported and [c.column for c in plan.added] == ["note"]


def test_an_upsert_key_change_is_refused_by_validate_and_the_run(spark, tmp_path, warehouse, sqlite_ledger, capsys):
    """The shard records its upsert key (field metadata): a key column dropped together with its
    name in ``upsert.key``, or the key changed over the same columns, is the key's change."""
    from reconcile.sink import mint, write

    sinks = tmp_path / "sinks"
    sinks.mkdir()
    upsert = {"source": {"format": "json", "path": "feed"}, "key": ["k", "k2"], "time_column": "ts"}
    upsert["offset_column"] = "off"
    schema = [*KV, {"name": "k2", "type": "int"}]
    for name in ("dropped", "rekeyed"):
        ShardTable(make_sink(sinks, name, "upsert", schema=schema, upsert=upsert)).ensure()
    assert schema_change.recorded_key(
        ShardTable(make_sink(sinks, "dropped", "upsert", schema=schema, upsert=upsert)).snapshot().schema().to_json()
    ) == ("k", "k2")
    one_key = {**upsert, "key": "k"}
    dropped = make_sink(sinks, "dropped", "upsert", schema=KV, upsert=one_key)  # k2 dropped, and from the key
    make_sink(sinks, "rekeyed", "upsert", schema=schema, upsert=one_key)  # the same columns, k alone the key
    capsys.readouterr()
    assert main(["validate", "--dir", str(sinks), "--no-spark"]) == 1
    out = capsys.readouterr().out
    for name in ("dropped", "rekeyed"):
        line = next(x for x in out.splitlines() if x.startswith(f"INVALID {name}:"))
        assert "upsert.key changed from [k, k2] (the shard's) to [k]" in line and "a new sink" in line, line
    assert "column k2 dropped: changes the upsert key" in out

    desc = mint.run_mint(sqlite_ledger, dropped, "r1", 1, 200).description
    with pytest.raises(SinkSchemaChange) as info:
        write.run_write(spark, sqlite_ledger, dropped, desc.batch_id)
    text = assert_one_line(info.value, "dropped")
    assert f"the sink file {dropped.path} changes the shard's upsert key" in text
    assert "upsert.key changed from [k, k2]" in text and "a new sink" in text
    assert ShardTable(dropped).latest_version() == 0  # nothing written


# --- a nullable column added to a query sink: one batch, one Delta version --------------------------


def _model(rows: list[dict], cols: list[str | None]) -> Counter:
    """The query's result as the shard holds it: each row's columns (None: a column the schema
    had not yet, read as null), no error."""
    return +Counter(tuple(r.get(c) if c else None for c in cols) + (None,) for r in rows)


@pytest.mark.slow  # four batches through Spark
def test_a_column_added_is_applied_by_one_batch_with_the_history_kept(
    spark, tmp_path, warehouse, sqlite_ledger, monkeypatch, capsys
):
    ledger = sqlite_ledger
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    src = tmp_path / "src"
    first = [{"k": i, "v": f"v{i}", "c": None if i % 3 == 0 else i * 10} for i in range(12)]
    write_json_rows(src, first)
    cfg = _sink(tmp_path, "grows", KV, current=True)
    for run, frontier in (("r1", 200), ("r2", 300)):
        *_, a = run_stages(spark, ledger, cfg, run, frontier)
        assert a.outcome == "committed", a.message
    before = update_log(cfg)
    version_before = ShardTable(cfg).latest_version()

    # the sink file adds the nullable column c (its query fills it, null for every third row)
    grown = _sink(
        tmp_path,
        "grows",
        [*KV, {"name": "c", "type": "int"}],
        sql="SELECT k, v, CAST(c AS INT) AS c FROM src",
        current=True,
    )
    *_, a = run_stages(spark, ledger, grown, "r3", 400)
    assert a.outcome == "committed", a.message
    table = ShardTable(grown)
    assert table.latest_version() == version_before + 1  # the schema and the correction in one version
    actions = [
        json.loads(x)
        for x in (warehouse / "grows" / "_delta_log" / f"{version_before + 1:020d}.json").read_text().splitlines()
    ]
    fields = [
        f["name"] for f in json.loads(next(x["metaData"] for x in actions if "metaData" in x)["schemaString"])["fields"]
    ]
    assert fields[:3] == ["k", "v", "c"]
    info = next(x["commitInfo"] for x in actions if "commitInfo" in x)
    meta = json.loads(info["userMetadata"])["reconcile"]
    assert meta["op"] == "batch" and meta["schema_change"] == "column c integer added"
    assert not table.check_schema()  # the table now has the sink file's columns

    log = update_log(grown)
    cols = ["k", "v", "c"]
    # older times read the new column as null, exactly what they held
    for t in (199, 299):
        held = as_of(before, cfg, t)
        assert held and +as_of(log, grown, t) == Counter({(k, v, None, err): n for (k, v, err), n in held.items()})
    assert +as_of(log, grown, 399) == _model(first, cols)
    # the correction retracted and re-added exactly the rows whose new column has a value
    changed = [u for u in log if u["_time"] == 399]
    assert Counter((u["k"], u["_diff"]) for u in changed) == Counter(
        {
            **{(r["k"], -1): 1 for r in first if r["c"] is not None},
            **{(r["k"], 1): 1 for r in first if r["c"] is not None},
        }
    )
    # the stored row keys of the files written before stay their rows' keys (xxhash64 skips nulls)
    from reconcile.storage import frames

    assert frames.wrong_row_keys(spark, table) == []
    split = table.keyed_files(table.latest_version())
    assert split is not None and split[1] == []  # every file's key read as stored

    # the current-state table followed in the same append: the sink file's columns, the model's rows
    from deltalake import DeltaTable

    from reconcile.storage.current import current_path

    current = DeltaTable(current_path(grown)).to_pyarrow_table()
    assert current.column_names == cols
    assert Counter(tuple(r.values()) + (None,) for r in current.to_pylist()) == _model(first, cols)

    # history stays readable across the change (DuckDB over delta-rs): older rows with c null
    from reconcile.sink import check

    def cli(*argv: str) -> dict:
        capsys.readouterr()
        assert main(list(argv)) == 0
        return json.loads(capsys.readouterr().out)

    valued = [r for r in first if r["c"] is not None]
    shown = cli("show", "grows", "--as-of", "299", "--json")["rows"]
    assert Counter((r["k"], r["v"], r["c"]) for r in shown for _ in range(r["count"])) == Counter(
        (r["k"], r["v"], None) for r in first
    )
    diff = cli("diff", "grows", "--from", "299", "--to", "399", "--json")["changes"]
    assert Counter((r["k"], r["v"], r["c"], r["diff"]) for r in diff) == Counter(
        [(r["k"], r["v"], None, -1) for r in valued] + [(r["k"], r["v"], r["c"], 1) for r in valued]
    )
    versions = cli("history", "grows", "--json")["versions"]
    closed = {(r["k"], r["c"]): r["valid_to"]["ms"] for r in versions if r["valid_to"] is not None}
    opened = {(r["k"], r["c"]): r["valid_from"]["ms"] for r in versions}
    assert closed == {(r["k"], None): 399 for r in valued}
    assert all(opened[(r["k"], r["c"])] == 399 for r in valued)
    assert check.violations(ledger, grown, spark=spark) == []
    lines, counts = check.verify_checksums(ledger, grown, spark)
    assert lines == [] and counts["verified"] >= 3, counts

    # the next batch goes on under the new schema
    nxt = [*first[:6], {"k": 99, "v": "new", "c": 7}]
    write_json_rows(src, nxt)
    *_, a = run_stages(spark, ledger, grown, "r4", 500)
    assert a.outcome == "committed", a.message
    assert +as_of(update_log(grown), grown, 499) == _model(nxt, cols)

    # a compaction rewrites the files under the new schema with fresh keys; reads stay exact
    from reconcile.sink.compact import run_compact

    done = run_compact(spark, ledger, grown, since=450)
    assert done.outcome == "compacted", done.message
    log = update_log(grown)
    assert +as_of(log, grown, 499) == _model(nxt, cols)
    assert frames.wrong_row_keys(spark, table) == [] and table.keyed_files(table.latest_version())[1] == []
    assert check.violations(ledger, grown, spark=spark) == []


# --- crashes, S3, the guard: a column added under the usual guarantees ------------------------------


def _grown_sink(directory: Path, name: str, **fields):
    sql = "SELECT k, v, CAST(c AS INT) AS c FROM src"
    return _sink(directory, name, [*KV, {"name": "c", "type": "int"}], sql=sql, **fields)


def run_job_killed_at(stage: str, cfg, run_id: str, point: str, remote: str | None = None) -> None:
    """The stage's job for ``run_id`` as its own process, killed at ``point`` (exit 137), as
    tests/test_crash.py runs it: a write in a local Spark JVM of its own (or a client of the Spark
    Connect server at ``remote``), an append without one."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    if stage == "write":
        cmd = [sys.executable, str(root / "jobs" / "write_correction.py"), "--sink", cfg.name, "--run-id", run_id]
    else:
        cmd = [sys.executable, "-m", "reconcile", "append", cfg.name, "--run-id", run_id]
    # a process killed inside the commit lease holds it for its TTL: a short one, not the retry's 30 s wait
    env = {**os.environ, "RECONCILE_FAILPOINTS": f"{point}=kill", "RECONCILE_COMMIT_LEASE_SECONDS": "5"}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    if remote:
        env["RECONCILE_SPARK_REMOTE"] = remote
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 137, f"expected a kill at {point}, got {proc.returncode}: {proc.stderr[-2000:]}"


CRASHES = [  # each retried (the next run after a kill past the commit: the rewrite's test below)
    "append.inside_lease",  # killed before the schema's commit: the retry commits it once
    "append.after_delta_commit",  # between the schema's commit and the ledger's confirmation
]


@pytest.mark.slow  # a killed append process, batches through Spark
@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("point", CRASHES)
def test_a_crash_around_the_schema_commit_recovers_to_the_model(
    spark, tmp_path, sqlite_ledger, monkeypatch, request, where, point
):
    from reconcile.sink import append, check, mint, write

    request.getfixturevalue("s3_warehouse" if where == "s3" else "warehouse")
    ledger = sqlite_ledger
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    rows = [{"k": i, "v": f"v{i}", "c": i if i % 2 else None} for i in range(6)]
    write_json_rows(tmp_path / "src", rows)
    name = f"crash_{point.split('.')[-1]}"
    cfg = _sink(tmp_path, name, KV)
    *_, a = run_stages(spark, ledger, cfg, "r1", 200)
    assert a.outcome == "committed", a.message
    version = ShardTable(cfg).latest_version()

    grown = _grown_sink(tmp_path, name)
    desc = mint.run_mint(ledger, grown, "r2", 1, 300).description
    assert write.run_write(spark, ledger, grown, desc.batch_id).outcome == "staged"
    run_job_killed_at("append", grown, "r2", point)
    table = ShardTable(grown)
    committed = point == "append.after_delta_commit"
    assert table.latest_version() == version + (1 if committed else 0)
    assert bool(table.check_schema()) is not committed  # the schema moves with the batch, never alone

    result = append.run_append(ledger, grown, desc.batch_id)  # the task's retry
    assert result.outcome == ("recovered" if committed else "committed"), result
    assert table.latest_version() == version + 1
    assert not table.check_schema()
    log = update_log(grown)
    assert +as_of(log, grown, 199) == _model(rows, ["k", "v", None])
    assert +as_of(log, grown, 299) == _model(rows, ["k", "v", "c"])
    assert sum(1 for u in log if u["_time"] == 299) == 2 * sum(1 for r in rows if r["c"] is not None)
    assert check.violations(ledger, grown, spark=spark) == []


@pytest.mark.slow  # batches through Spark
def test_the_guard_stops_a_schema_change_that_rewrites_most_rows_until_approved(
    spark, tmp_path, warehouse, sqlite_ledger
):
    from reconcile.errors import CorrectionBlocked
    from reconcile.sink import append, mint, write

    ledger = sqlite_ledger
    rows = [{"k": i, "v": f"v{i}", "c": i} for i in range(10)]
    write_json_rows(tmp_path / "src", rows)
    guard = {"max_share": 0.5, "min_rows": 5}
    cfg = _sink(tmp_path, "guarded", KV, correction_guard=guard)
    *_, a = run_stages(spark, ledger, cfg, "r1", 200)
    assert a.outcome == "committed", a.message
    version = ShardTable(cfg).latest_version()

    desc = mint.run_mint(ledger, cfg, "r2", 1, 300).description
    rows[0]["v"] = "changed"
    write_json_rows(tmp_path / "src", rows)
    assert write.run_write(spark, ledger, cfg, desc.batch_id).outcome == "staged"  # before the file changes
    grown = _grown_sink(tmp_path, "guarded", correction_guard=guard)
    with pytest.raises(StagedBatchInvalid) as stale:  # staged without the new column: its write again
        append.run_append(ledger, grown, desc.batch_id)
    assert "no column c" in assert_one_line(stale.value, "guarded") and "rerun its write" in str(stale.value.remedy)
    assert write.run_write(spark, ledger, grown, desc.batch_id).outcome == "staged"  # not kept: staged anew
    with pytest.raises(CorrectionBlocked) as info:
        append.run_append(ledger, grown, desc.batch_id)
    assert "approve" in assert_one_line(info.value, "guarded")
    assert ShardTable(grown).latest_version() == version and ShardTable(grown).check_schema()  # nothing moved

    result = append.run_append(ledger, grown, desc.batch_id, approve="on-call")
    assert result.outcome == "committed", result
    assert not ShardTable(grown).check_schema()
    assert +as_of(update_log(grown), grown, 299) == _model(rows, ["k", "v", "c"])


# --- upsert and change-log sinks: a new value column ------------------------------------------------


@pytest.mark.slow  # four batches through Spark
def test_upsert_and_changelog_sinks_take_a_new_value_column(spark, tmp_path, warehouse, sqlite_ledger):
    ledger = sqlite_ledger
    grown_schema = [*KV, {"name": "c", "type": "int"}]

    # upsert: commands (k, v[, c], ts, off); all-null values delete the key
    upsert = {"source": {"format": "json", "path": "feed"}, "key": "k", "time_column": "ts", "offset_column": "off"}
    old = [{"k": k, "v": f"v{k}", "ts": 150, "off": k} for k in (1, 2, 3, 4)]
    write_json_rows(tmp_path / "feed", old)
    cfg = make_sink(tmp_path, "ups", "upsert", schema=KV, upsert=upsert, current=True)
    *_, a = run_stages(spark, ledger, cfg, "r1", 200)
    assert a.outcome == "committed", a.message
    new = [
        {"k": 1, "v": "v1b", "c": 5, "ts": 250, "off": 10},
        {"k": 5, "v": "v5", "c": 7, "ts": 260, "off": 11},
        {"k": 2, "v": None, "c": None, "ts": 270, "off": 12},  # a delete
    ]
    write_json_rows(tmp_path / "feed", old + new)
    grown = make_sink(tmp_path, "ups", "upsert", schema=grown_schema, upsert=upsert, current=True)
    # rebuild-current before the run: the current-state table in the file's columns (c null), which
    # the batch that adds the column then changes by key like any batch (nothing rebuilt again)
    from deltalake import DeltaTable

    from reconcile.sink.current import maintain
    from reconcile.storage.current import current_path

    done = maintain(ledger, grown, ShardTable(grown), rebuild="rebuilt on request (rebuild-current)")
    assert done is not None and done.outcome == "rebuilt" and "in the sink file's columns" in done.why, done
    current = DeltaTable(current_path(grown)).to_pyarrow_table()
    assert current.column_names == ["k", "v", "c"]
    assert Counter(map(tuple, map(dict.values, current.to_pylist()))) == Counter((r["k"], r["v"], None) for r in old)
    *_, a = run_stages(spark, ledger, grown, "r2", 300)
    assert a.outcome == "committed", a.message
    assert a.current is not None and a.current.outcome == "applied", a.current
    # the model: one value per key; keys no command touched keep null in the new column
    state = {r["k"]: (r["v"], None) for r in old}
    before = Counter((k, v, None, None) for k, (v, _) in state.items())
    for c in new:
        if c["v"] is None and c["c"] is None:
            state.pop(c["k"])
        else:
            state[c["k"]] = (c["v"], c["c"])
    log = update_log(grown)
    assert +as_of(log, grown, 199) == before
    assert +as_of(log, grown, 299) == Counter((k, v, c, None) for k, (v, c) in state.items())
    assert not ShardTable(grown).check_schema()
    current = DeltaTable(current_path(grown)).to_pyarrow_table()
    assert Counter(map(tuple, map(dict.values, current.to_pylist()))) == Counter(
        (k, v, c) for k, (v, c) in state.items()
    )
    from reconcile.sink import check

    assert check.violations(ledger, grown, spark=spark) == []

    # change log: rows (k, v[, c]) with a time and a diff; older rows read c as null
    changelog = {"source": {"format": "json", "path": "log"}, "time_column": "ts", "diff_column": "diff"}
    first = [{"k": 1, "v": "a", "ts": 150, "diff": 1}, {"k": 2, "v": "b", "ts": 160, "diff": 1}]
    write_json_rows(tmp_path / "log", first)
    cfg = make_sink(tmp_path, "chg", "changelog", schema=KV, changelog=changelog)
    *_, a = run_stages(spark, ledger, cfg, "r1", 200)
    assert a.outcome == "committed", a.message
    more = [
        {"k": 1, "v": "a", "c": None, "ts": 250, "diff": -1},
        {"k": 1, "v": "a", "c": 5, "ts": 250, "diff": 1},
        {"k": 3, "v": "c", "c": 7, "ts": 260, "diff": 1},
    ]
    write_json_rows(tmp_path / "log", first + more)
    grown = make_sink(tmp_path, "chg", "changelog", schema=grown_schema, changelog=changelog)
    *_, a = run_stages(spark, ledger, grown, "r2", 300)
    assert a.outcome == "committed", a.message
    model: Counter = Counter()
    for r in first + more:
        if r["ts"] < 300:
            model[(r["k"], r["v"], r.get("c"), None)] += r["diff"]
    log = update_log(grown)
    assert +as_of(log, grown, 199) == Counter({(1, "a", None, None): 1, (2, "b", None, None): 1})
    assert +as_of(log, grown, 299) == +model
    # the new updates at their own times, nothing rewritten
    assert sorted(u["_time"] for u in log if u["_time"] >= 200) == [250, 250, 260]


@pytest.mark.slow  # two append processes racing, batches through Spark
@pytest.mark.parametrize("change", ["added", "rewrite"])
def test_two_appends_racing_commit_the_schema_change_once(
    spark, tmp_path, warehouse, sqlite_ledger, monkeypatch, change
):
    import subprocess
    import sys

    from reconcile.sink import mint, write

    ledger = sqlite_ledger
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    name = f"raced_{change}"
    if change == "added":
        rows = [{"k": i, "v": f"v{i}", "c": i} for i in range(5)]
        cfg, cols = _sink(tmp_path, name, KV), ["k", "v", "c"]
    else:  # n widened, v renamed, gone dropped, reordered: the shard rewritten in the batch's version
        rows = [{"k": i, "n": i, "v": f"v{i}", "gone": "g"} for i in range(5)]
        cfg, cols = _sink(tmp_path, name, OLD, sql="SELECT k, CAST(n AS INT) AS n, v, gone FROM src"), ["k", "v", "n"]
    write_json_rows(tmp_path / "src", rows)
    *_, a = run_stages(spark, ledger, cfg, "r1", 200)
    assert a.outcome == "committed", a.message
    version = ShardTable(cfg).latest_version()
    if change == "added":
        grown = _grown_sink(tmp_path, name)
    else:
        grown = _sink(tmp_path, name, NEW, sql="SELECT k, v AS w, CAST(n AS BIGINT) AS n FROM src")
    desc = mint.run_mint(ledger, grown, "r2", 1, 300).description
    assert write.run_write(spark, ledger, grown, desc.batch_id).outcome == "staged"

    cmd = [sys.executable, "-m", "reconcile", "append", name, "--run-id", "r2"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    said = sorted(o.split("append: ", 1)[1].split(":")[0].split(" |")[0] for o, _ in outs)
    # one appended it; the other found it committed (by the lease's turn or the commit guard)
    assert said.count("appended batch") == 1, said
    other = next(x for x in said if x != "appended batch")
    assert (
        other == "recovered" or f"committed it (Delta version {version + 1})" in other or "already committed" in other
    ), said
    table = ShardTable(grown)
    assert table.latest_version() == version + 1  # one commit: the schema and the batch
    metas = [
        v
        for v in range(version + 1)
        if any(
            "metaData" in json.loads(x)
            for x in (warehouse / name / "_delta_log" / f"{v:020d}.json").read_text().splitlines()
        )
    ]
    assert metas == [0]  # before the race, only the table's creation set the schema
    assert not table.check_schema()
    assert +as_of(update_log(grown), grown, 299) == _model(rows, cols)


# --- widened, dropped, renamed, reordered: the shard rewritten by the batch, in its one version ------

OLD = [
    {"name": "k", "type": "bigint", "nullable": False},
    {"name": "n", "type": "int"},
    {"name": "v", "type": "string"},
    {"name": "gone", "type": "string"},
]
NEW = [  # n widened, v renamed to w, gone dropped, and the order changed
    {"name": "k", "type": "bigint", "nullable": False},
    {"name": "w", "type": "string", "renamed_from": "v"},
    {"name": "n", "type": "bigint"},
]


@pytest.mark.slow  # batches through Spark, a rewrite
def test_a_widening_drop_and_rename_rewrite_the_shard_in_the_batchs_one_version(
    spark, tmp_path, warehouse, sqlite_ledger, monkeypatch, capsys
):
    from reconcile.sink import check

    ledger = sqlite_ledger
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    src = tmp_path / "src"
    rows = [{"k": i, "n": i * 7, "v": f"v{i}", "gone": "g" if i % 2 else None} for i in range(10)]
    write_json_rows(src, rows)
    cfg = _sink(tmp_path, "evolving", OLD, sql="SELECT k, CAST(n AS INT) AS n, v, gone FROM src", current=True)
    for run, frontier in (("r1", 200), ("r2", 300)):
        *_, a = run_stages(spark, ledger, cfg, run, frontier)
        assert a.outcome == "committed", a.message
    before = update_log(cfg)
    version = ShardTable(cfg).latest_version()

    later = [{**r, "n": r["n"] + (1 if r["k"] == 3 else 0)} for r in rows if r["k"] != 9]  # one changed, one gone
    write_json_rows(src, later)
    new = _sink(tmp_path, "evolving", NEW, sql="SELECT k, v AS w, CAST(n AS BIGINT) AS n FROM src", current=True)
    assert main(["validate", "--dir", str(tmp_path), "--no-spark"]) == 0
    said = capsys.readouterr().out
    assert (
        "column v renamed to w; column n widened from integer to long; column gone dropped; columns reordered (k, v, n)"
        in said
    )
    assert f"{len(before)} update rows rewritten" in said
    files_before = set(ShardTable(cfg).snapshot_files())
    *_, a = run_stages(spark, ledger, new, "r3", 400)
    assert a.outcome == "committed", a.message
    table = ShardTable(new)
    assert table.latest_version() == version + 1  # the new schema, the rewrite and the correction: one version
    assert not table.check_schema()
    actions = table.commit_actions(version + 1)
    meta = json.loads(next(x["commitInfo"] for x in actions if "commitInfo" in x)["userMetadata"])["reconcile"]
    assert meta["op"] == "batch" and meta["rekeyed"] and meta["rows_rewritten"] == len(before)
    assert meta["schema_change"].startswith("column v renamed to w")
    assert {x["remove"]["path"] for x in actions if "remove" in x} == files_before  # every old file, in it
    assert any("metaData" in x for x in actions) and {x["txn"]["version"] for x in actions if "txn" in x} == {300}

    log = update_log(new)
    for t in (199, 299):  # the older times hold what they held, in the new schema
        assert +as_of(log, new, t) == +Counter(
            {(k, v, n, err): c for (k, n, v, _gone, err), c in as_of(before, cfg, t).items()}
        )
    cols = ["k", "v", "n"]
    assert +as_of(log, new, 399) == _model(later, cols)
    assert sorted((u["k"], u["_diff"]) for u in log if u["_time"] == 399) == [(3, -1), (3, 1), (9, -1)]
    # show --as-of, diff and history read across the change, in the new columns (DuckDB over delta-rs)
    capsys.readouterr()
    assert main(["show", "evolving", "--as-of", "299", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["rows"]
    assert Counter((r["k"], r["w"], r["n"]) for r in shown for _ in range(r["count"])) == Counter(
        (r["k"], r["v"], r["n"]) for r in rows
    )
    assert main(["diff", "evolving", "--from", "299", "--to", "399", "--json"]) == 0
    diff = json.loads(capsys.readouterr().out)["changes"]
    assert sorted((r["k"], r["n"], r["diff"]) for r in diff) == [(3, 21, -1), (3, 22, 1), (9, 63, -1)]
    assert main(["history", "evolving", "--json"]) == 0
    versions = json.loads(capsys.readouterr().out)["versions"]
    assert {(r["k"], r["n"]) for r in versions if r["valid_to"] is not None} == {(3, 21), (9, 63)}
    # the current-state table followed: the sink file's columns, in its order and types
    from deltalake import DeltaTable

    from reconcile.storage.current import current_path

    current = DeltaTable(current_path(new)).to_pyarrow_table()
    assert current.column_names == ["k", "w", "n"] and str(current.schema.field("n").type) == "int64"
    assert Counter(tuple(r.values()) + (None,) for r in current.to_pylist()) == _model(later, cols)
    # every row's key is fresh: read as stored, none wrong; check --deep and --verify hold
    from reconcile.storage import frames

    assert frames.wrong_row_keys(spark, table) == [] and table.keyed_files(table.latest_version())[1] == []
    assert check.violations(ledger, new, spark=spark) == []
    lines, counts = check.verify_checksums(ledger, new, spark)
    assert lines == [], lines
    # the batch after the rewrite verifies; the two before it recorded the old columns' hashes
    assert (counts["verified"], counts["not_verifiable"]) == (1, 2), counts


REWRITE_CRASHES = [  # a kill at each fail point on the way, each recovered by what comes next
    ("write", "write.after_partition_staged"),  # before the stage ends: nothing recorded
    ("write", "write.after_staged"),  # the batch and its rewrite staged, nothing committed
    ("append", "append.inside_lease"),  # right before the one commit
    ("append", "append.after_delta_commit"),  # the schema, rewrite and batch committed; the ledger not
]


@pytest.mark.slow  # killed write (Spark Connect clients) and append processes, batches through Spark
@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_rewrite_killed_anywhere_finds_the_old_table_or_the_new_one(
    spark, tmp_path, sqlite_ledger, monkeypatch, request, where
):
    """One batch's write and append killed again and again on the way: each retry finds the old
    table (and stages the batch anew or goes on with what is staged) or the new one (and goes on);
    the next run ends at the model with ``check`` clean and the killed attempt's rewrite deleted.
    On S3 only the appends are killed (a write's kill there needs a Spark JVM of its own)."""
    from reconcile.sink import check, evolve, mint, write
    from reconcile.storage import files

    request.getfixturevalue("s3_warehouse" if where == "s3" else "warehouse")
    remote = request.getfixturevalue("connect_url") if where == "local" else None
    ledger = sqlite_ledger
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    rows = [{"k": i, "n": i, "v": f"v{i}", "gone": "g"} for i in range(6)]
    write_json_rows(tmp_path / "src", rows)
    cfg = _sink(tmp_path, "killed", OLD, sql="SELECT k, CAST(n AS INT) AS n, v, gone FROM src")
    *_, a = run_stages(spark, ledger, cfg, "r1", 200)
    assert a.outcome == "committed", a.message
    version = ShardTable(cfg).latest_version()

    later = [{**r, "n": r["n"] * 2} for r in rows]
    write_json_rows(tmp_path / "src", later)
    new = _sink(tmp_path, "killed", NEW, sql="SELECT k, v AS w, CAST(n AS BIGINT) AS n FROM src")
    desc = mint.run_mint(ledger, new, "r2", 1, 300).description
    table = ShardTable(new)
    killed: set[str] = set()
    for stage, point in REWRITE_CRASHES:
        if stage == "write" and remote is None:
            continue
        if stage == "append":  # the write's retry: the staged batch and its rewrite kept while the table is as read
            was = ledger.get_batch(desc.batch_id, "killed").state
            assert write.run_write(spark, ledger, new, desc.batch_id).outcome == (
                "already_staged" if was == "staged" else "staged"
            )
        before = set(table.staged_attempts(desc.batch_id))
        run_job_killed_at(stage, new, "r2", point, remote)
        killed |= set(table.staged_attempts(desc.batch_id)) - before
        committed = point == "append.after_delta_commit"
        assert table.latest_version() == version + committed  # the old table or the new one, never between
        assert bool(table.check_schema()) is not committed
        state = ledger.get_batch(desc.batch_id, "killed").state
        assert state == ("minted" if point == "write.after_partition_staged" else "staged"), point
    if remote is not None:  # the first write died unrecorded with its rewrite staged; the second recorded
        assert len(killed) == 2
        assert all(files.path_exists(f"{table.staging_path(desc.batch_id, s)}/{evolve.REWRITE_DIR}") for s in killed)

    later2 = [*later, {"k": 99, "n": 1, "v": "new", "gone": None}]
    write_json_rows(tmp_path / "src", later2)
    *_, a = run_stages(spark, ledger, new, "r3", 400)  # the next run: its sync absorbs the killed commit
    assert a.outcome == "committed", a.message
    assert ledger.get_batch(desc.batch_id, "killed").state == "committed"
    assert table.latest_version() == version + 2
    log = update_log(new)
    cols = ["k", "v", "n"]
    assert +as_of(log, new, 199) == _model(rows, cols)
    assert +as_of(log, new, 299) == _model(later, cols)
    assert +as_of(log, new, 399) == _model(later2, cols)
    assert check.violations(ledger, new, spark=spark) == []
    assert check.verify_checksums(ledger, new, spark)[0] == []
    committed_stage = ledger.get_batch(desc.batch_id, "killed").stage_id
    assert table.staged_attempts(desc.batch_id) == [committed_stage]  # every other attempt deleted


@pytest.mark.slow  # batches through Spark, a rewrite, a compaction
def test_a_compaction_before_a_rewrites_append_restages_it_and_the_guard_stops_it_until_approved(
    spark, tmp_path, warehouse, sqlite_ledger, monkeypatch, capsys
):
    """A compaction that lands between a rewrite batch's write and its append (the CLI's compact
    by a worker still on the sink file from before the edit: the current file's compaction waits
    for the batch) makes the append refuse, nothing committed; the rerun write stages it against
    the compacted table, and the correction guard holds it until approved."""
    from reconcile.errors import CorrectionBlocked
    from reconcile.sink import append, check, mint, write

    ledger = sqlite_ledger
    rows = [{"k": i, "n": i, "v": f"v{i}", "gone": None} for i in range(6)]
    write_json_rows(tmp_path / "src", rows)
    guard = {"max_share": 0.5, "min_rows": 5}
    sql = "SELECT k, CAST(n AS INT) AS n, v, gone FROM src"
    cfg = _sink(tmp_path, "guarded_rw", OLD, sql=sql, correction_guard=guard)
    *_, a = run_stages(spark, ledger, cfg, "r1", 200)
    assert a.outcome == "committed", a.message
    version = ShardTable(cfg).latest_version()

    new = _sink(
        tmp_path, "guarded_rw", NEW, sql="SELECT k, v AS w, CAST(n AS BIGINT) AS n FROM src", correction_guard=guard
    )
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    capsys.readouterr()
    assert main(["dry-run", "guarded_rw"]) == 0  # says so before the run
    said = capsys.readouterr().out
    assert "correction guard would STOP" in said and "rewrites all 6 update rows" in said, said
    desc = mint.run_mint(ledger, new, "r2", 1, 300).description
    assert write.run_write(spark, ledger, new, desc.batch_id).outcome == "staged"
    staged_at = ledger.get_batch(desc.batch_id, "guarded_rw").stage_id

    # the compaction, by a worker whose sink file predates the edit
    stale_dir = tmp_path / "stale"
    stale_dir.mkdir()
    _sink(stale_dir, "guarded_rw", OLD, sql=sql, correction_guard=guard)
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(stale_dir))
    capsys.readouterr()
    assert main(["compact", "guarded_rw", "--since", "150"]) == 0
    assert "compacted the shard's history" in capsys.readouterr().out
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    assert ShardTable(new).latest_version() == version + 1 and ledger.get_shard("guarded_rw").since == 150
    with pytest.raises(StagedBatchInvalid) as stale:
        append.run_append(ledger, new, desc.batch_id)
    text = assert_one_line(stale.value, "guarded_rw")
    assert f"rewrites the shard as of Delta version {version}, and the table is at {version + 1} now" in text
    assert "rerun its write" in text
    assert ShardTable(new).latest_version() == version + 1 and ShardTable(new).check_schema().rewrites  # nothing moved
    # the rerun write stages it again against the compacted table
    assert write.run_write(spark, ledger, new, desc.batch_id).outcome == "staged"
    assert ledger.get_batch(desc.batch_id, "guarded_rw").stage_id != staged_at

    # the correction changes no row's value, the rewrite every row's file: the guard counts those
    with pytest.raises(CorrectionBlocked) as info:
        append.run_append(ledger, new, desc.batch_id)
    text = assert_one_line(info.value, "guarded_rw")
    assert "would insert 0 and retract 0" in text and "rewrite all 6 update rows" in text
    assert f"approve guarded_rw {desc.batch_id}" in text
    assert ShardTable(new).latest_version() == version + 1 and ShardTable(new).check_schema().rewrites  # nothing moved

    result = append.run_append(ledger, new, desc.batch_id, approve="on-call")
    assert result.outcome == "committed", result
    assert ShardTable(new).latest_version() == version + 2 and not ShardTable(new).check_schema()
    log = update_log(new)
    assert +as_of(log, new, 199) == +as_of(log, new, 299) == _model(rows, ["k", "v", "n"])
    assert check.violations(ledger, new, spark=spark) == []
    assert check.verify_checksums(ledger, new, spark)[0] == []
    assert ShardTable(new).staged_attempts(desc.batch_id) == [ledger.get_batch(desc.batch_id, "guarded_rw").stage_id]


@pytest.mark.slow  # a batch through Spark
def test_reads_while_a_change_waits_for_its_run_are_in_the_sink_files_columns(
    spark, tmp_path, warehouse, sqlite_ledger, monkeypatch, capsys
):
    """Between the sink file's edit and the run that applies it, show, history and dry-run read
    the shard in the file's columns (renamed under the new name, dropped left out, added null),
    and ``rebuild-current`` writes the current-state table in them, which the run then follows."""
    from deltalake import DeltaTable

    from reconcile.sink import check
    from reconcile.storage.current import current_path

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    rows = [{"k": i, "n": i, "v": f"v{i}", "gone": "g"} for i in range(4)]
    write_json_rows(tmp_path / "src", rows)
    cfg = _sink(tmp_path, "pending", OLD, sql="SELECT k, CAST(n AS INT) AS n, v, gone FROM src", current=True)
    *_, a = run_stages(spark, sqlite_ledger, cfg, "r1", 200)
    assert a.outcome == "committed", a.message
    pending = _sink(
        tmp_path,
        "pending",
        [*NEW, {"name": "extra", "type": "string"}],
        sql="SELECT k, v AS w, CAST(n AS BIGINT) AS n, CAST(NULL AS STRING) AS extra FROM src",
        current=True,
    )

    def cli(*argv: str):
        capsys.readouterr()
        assert main(list(argv)) == 0
        out = capsys.readouterr().out
        return json.loads(out) if "--json" in argv else out

    shown = cli("show", "pending", "--json")["rows"]
    assert [(r["k"], r["w"], r["n"], r["extra"], r["count"]) for r in shown] == [
        (r["k"], r["v"], r["n"], None, 1) for r in rows
    ]
    assert all("gone" not in r for r in shown)
    versions = cli("history", "pending", "--json")["versions"]
    assert sorted((r["k"], r["w"]) for r in versions) == [(r["k"], r["v"]) for r in rows]
    assert "0 update(s)" in cli("dry-run", "pending")  # the rewrite changes no row's value: nothing to correct
    # a compaction (it reads and writes in the sink file's columns) waits for the batch that applies it
    from reconcile.sink.compact import run_compact

    version = ShardTable(cfg).latest_version()
    done = run_compact(spark, sqlite_ledger, pending, since=150)
    assert done.outcome == "nothing" and "schema change" in done.message and "waits" in done.message, done
    assert ShardTable(cfg).latest_version() == version and sqlite_ledger.get_shard("pending").since < 150

    # check --deep reads both the shard and the current-state table (still in the old columns) in the file's
    # (check --deep and --verify recompute the batches' checksums and row keys under the columns they hashed)
    assert check.violations(sqlite_ledger, pending, spark=spark) == []
    lines, counts = check.verify_checksums(sqlite_ledger, pending, spark)
    assert lines == [] and counts["verified"] == 1, (lines, counts)
    # rebuild-current: the current-state table in the sink file's columns, the shard's rows read in them
    said = cli("rebuild-current", "pending")
    assert "current-state table rebuilt" in said and "in the sink file's columns" in said, said
    assert ShardTable(cfg).latest_version() == version  # the shard waits for its run

    def current_rows() -> tuple[list[str], str, Counter]:
        current = DeltaTable(current_path(pending)).to_pyarrow_table()
        return (
            current.column_names,
            str(current.schema.field("n").type),
            Counter(map(tuple, map(dict.values, current.to_pylist()))),
        )

    assert current_rows() == (["k", "w", "n", "extra"], "int64", Counter((r["k"], r["v"], r["n"], None) for r in rows))
    assert check.violations(sqlite_ledger, pending, spark=spark) == []
    # a foreign writer changes the shard (in its columns): a value only the renamed column tells
    # apart, one only the dropped column does (no difference in the file's columns), a new row
    foreign = [  # (k, n, v, gone, _time, _diff)
        (2, 2, "v2", "g", 199, -1),
        (2, 2, "v2x", "g", 199, 1),
        (3, 3, "v3", "other", 199, -1),
        (3, 3, "v3", "g", 199, 1),
        (50, 5, "f", None, 150, 1),
    ]
    _foreign_append(ShardTable(cfg).path, foreign)
    # the run applies the change (the shard rewritten in its batch's version); the current table follows
    later = [{**r, "n": 100} if r["k"] == 1 else r for r in rows[1:]]  # k 0 gone, k 1 changed
    write_json_rows(tmp_path / "src", later)
    m, _, a = run_stages(spark, sqlite_ledger, pending, "r2", 300)
    assert a.outcome == "committed", a.message
    assert ShardTable(pending).latest_version() == version + 2 and not ShardTable(pending).check_schema()
    # its drift: what the foreign version changed, in the sink file's columns (w read from v)
    net: Counter = Counter()
    for k, n, v, _gone, t, d in foreign:
        net[(k, v, n, t)] += d
    assert sqlite_ledger.get_batch(m.description.batch_id, "pending").drift_rows == sum(
        abs(d) for (*_, t), d in net.items() if t < 300
    )
    model = Counter((r["k"], r["v"], r["n"], None) for r in later)
    assert +as_of(update_log(pending), pending, 299) == Counter({(*row, None): n for row, n in model.items()})
    assert current_rows() == (["k", "w", "n", "extra"], "int64", model)
    assert check.violations(sqlite_ledger, pending, spark=spark) == []


def _foreign_append(path: str, rows: list[tuple]) -> None:
    """A foreign writer (delta-rs) appends ``(k, n, v, gone, _time, _diff)`` rows to a shard of
    the columns ``OLD``, its stored row key null."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    k, n, v, gone, t, d = zip(*rows, strict=True)
    table = pa.table(
        {
            "k": pa.array(k, pa.int64()),
            "n": pa.array(n, pa.int32()),
            "v": pa.array(v, pa.string()),
            "gone": pa.array(gone, pa.string()),
            "_time": pa.array(t, pa.int64()),
            "_diff": pa.array(d, pa.int64()),
            "_error": pa.array([None] * len(k), pa.string()),
        }
    )
    for f in DeltaTable(path).schema().to_arrow():
        if f.name not in table.column_names:
            table = table.append_column(f.name, pa.nulls(len(k), pa.field(f).type))
    write_deltalake(path, table, mode="append")


@pytest.mark.slow  # batches through Spark, a rewrite
def test_an_upsert_sink_widens_and_drops_a_value_column_by_a_rewrite(spark, tmp_path, warehouse, sqlite_ledger):
    ledger = sqlite_ledger
    upsert = {"source": {"format": "json", "path": "feed"}, "key": "k", "time_column": "ts", "offset_column": "off"}
    old_schema = [KV[0], {"name": "n", "type": "int"}, {"name": "gone", "type": "string"}]
    old = [{"k": k, "n": k * 10, "gone": "g", "ts": 150, "off": k} for k in (1, 2, 3)]
    write_json_rows(tmp_path / "feed", old)
    cfg = make_sink(tmp_path, "ups_rw", "upsert", schema=old_schema, upsert=upsert, current=True)
    *_, a = run_stages(spark, ledger, cfg, "r1", 200)
    assert a.outcome == "committed", a.message

    new = [{"k": 2, "n": 2**40, "ts": 250, "off": 10}]  # a value only the widened column holds
    write_json_rows(tmp_path / "feed", old + new)
    new_schema = [KV[0], {"name": "n", "type": "bigint"}]
    grown = make_sink(tmp_path, "ups_rw", "upsert", schema=new_schema, upsert=upsert, current=True)
    # the current-state table rebuilt in the file's columns before the run (rebuild-current): the
    # batch's version, the whole shard rewritten, is then never applied to it as a change
    from reconcile.sink.current import maintain

    assert maintain(ledger, grown, ShardTable(grown), rebuild="rebuild-current").outcome == "rebuilt"
    *_, a = run_stages(spark, ledger, grown, "r2", 300)
    assert a.outcome == "committed", a.message
    assert a.current is not None and a.current.outcome == "rebuilt", a.current
    log = update_log(grown)
    assert +as_of(log, grown, 199) == Counter({(k, k * 10, None): 1 for k in (1, 2, 3)})
    model = Counter({(1, 10, None): 1, (2, 2**40, None): 1, (3, 30, None): 1})
    assert +as_of(log, grown, 299) == model
    assert all("gone" not in u for u in log)
    from deltalake import DeltaTable

    from reconcile.storage.current import current_path

    current = DeltaTable(current_path(grown)).to_pyarrow_table()
    assert current.column_names == ["k", "n"] and str(current.schema.field("n").type) == "int64"
    assert Counter(tuple(r.values()) + (None,) for r in current.to_pylist()) == model
    # the next batch reads the rewritten files for its keys (their key ranges), as any shard's
    write_json_rows(tmp_path / "feed", [*old, *new, {"k": 3, "n": 31, "ts": 350, "off": 11}])
    *_, a = run_stages(spark, ledger, grown, "r3", 400)
    assert a.outcome == "committed", a.message
    model = Counter({(1, 10, None): 1, (2, 2**40, None): 1, (3, 31, None): 1})
    assert +as_of(update_log(grown), grown, 399) == model
    from reconcile.sink import check

    assert check.violations(ledger, grown, spark=spark) == []
