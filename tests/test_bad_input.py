"""Bad input: every kind fails with a clear, typed, one-line error and commits nothing.

Each test feeds the sink one kind of bad input and checks three things:

1. the specific exception type (or, for rows that do not fit, error rows that are stored, never
   dropped, and counted in the ledger);
2. ``str(exc)`` is one line ``sink '<name>': <cause>. Remedy: <what to clear or fix>`` (a
   :class:`ConfigError` names the file and the field instead);
3. nothing was committed: the shard's upper in the metadata did not move, no new Delta version
   (and no batch commit) was written, and where relevant no staged files remain.

Data is tiny and most sinks use ``as_of = 0`` so that the first batch's ``lower`` equals the new
shard's upper (0): an append that fails then must leave the upper exactly where it was (with
``as_of > 0`` the append first advances a brand-new shard's upper to ``as_of``, which covers no
data; see ``append.run_append``).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from sqlalchemy import update
from sqlalchemy.exc import SQLAlchemyError

from helpers import (
    Snapshot,
    assert_one_line,
    change,
    leftover_staged,
    make_sink,
    orders_config,
    run_stages,
    snapshot,
    write_json_rows,
)
from reconcile.airflow import tasks
from reconcile.config_loading import load_file
from reconcile.errors import (
    BatchNotFound,
    ConfigError,
    DescriptionOutdated,
    LostRace,
    MetadataUnavailable,
    Retryable,
    ShardNotFound,
    ShardSchemaChanged,
    SourceError,
    StagedBatchInvalid,
)
from reconcile.kinds.decode import validate
from reconcile.log import iso
from reconcile.model import COMMITTED, MINTED, STAGED, SUPERSEDED
from reconcile.sink import append, check, mint, write
from reconcile.sink.sync import sync
from reconcile.storage import files, frames
from reconcile.storage.commits import batch_commits
from reconcile.storage.delta import ShardTable
from reconcile.storage.ledger import Ledger
from reconcile.storage.ledger_rows import Batch

ROWS = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"k": 3, "v": "c"}, {"k": 4, "v": "d"}]
BAD_PG_URL = "postgresql+psycopg://nobody:secret@127.0.0.1:1/none"


# --- helpers ----------------------------------------------------------------------------------


def assert_nothing_committed(spark, ledger, cfg, before: Snapshot, *, unstaged: str | None = None) -> None:
    """The shard's upper, its Delta versions and the committed batches are as ``before``;
    ``unstaged``: a batch that must have no staged files."""
    after = snapshot(spark, ledger, cfg)
    assert after == before, f"something was committed: {before} -> {after}"
    if unstaged is not None:
        assert files.list_files(ShardTable(cfg).staging_path(unstaged)) == {}
        assert ledger.get_batch(unstaged).state != COMMITTED


def new_sink(spark, tmp_path: Path, name: str, kind: str = "query", rows=ROWS, **fields):
    """A sink with as_of 0, its source written and its (empty) Delta table created."""
    cfg = make_sink(tmp_path, name, kind=kind, as_of=fields.pop("as_of", 0), **fields)
    if rows is not None:
        write_json_rows(tmp_path / ("log" if kind == "changelog" else "src"), rows)
    ShardTable(cfg).ensure()
    return cfg


def staged_batch(spark, ledger, cfg, run_id: str = "run-1", frontier: int = 200):
    """Mint and stage a batch; returns (description, its staged files {relative path: size})."""
    desc = mint.run_mint(ledger, cfg, run_id, 1, frontier).description
    assert desc is not None
    w = write.run_write(spark, ledger, cfg, desc.batch_id)
    assert w.outcome == "staged", w.message
    staged = files.list_files(stage_dir(ledger, cfg, desc.batch_id))
    assert staged, "the batch staged no files"
    return desc, staged


def stage_dir(ledger, cfg, batch_id: str) -> str:
    """The directory of the write attempt whose files the batch's manifest names."""
    return ShardTable(cfg).staging_path(batch_id, ledger.get_batch(batch_id).stage_id)


def shard_rows(spark, cfg, t: int) -> Counter:
    """The shard as of t: (k, v, _error) -> multiplicity, read with plain Spark."""
    out: Counter = Counter()
    for r in frames.read_updates(spark, ShardTable(cfg)).collect():
        if r["_time"] <= t:
            out[(r["k"], r["v"], r["_error"])] += r["_diff"]
    return +out


def error_rows(rows: Counter) -> dict[str, int]:
    return {err: n for (k, v, err), n in rows.items() if err is not None and k is None and v is None}


def set_batch(ledger, batch_id: str, **values) -> None:
    """Tamper with a ledger row, as an operator (or a bug) might."""
    with ledger.tx() as s:
        s.execute(update(Batch).where(Batch.batch_id == batch_id).values(**values))


# --- config files -----------------------------------------------------------------------------


def test_sql_injection_in_a_column_name_is_a_config_error(tmp_path):
    path = orders_config(tmp_path, schema__1__name="v` STRING, x INT) --")
    with pytest.raises(ConfigError) as info:
        load_file(path)
    err = info.value
    assert (err.path, err.field) == (str(path), "schema[1].name")
    text = str(err)
    assert "\n" not in text
    assert str(path) in text and "'schema[1].name'" in text and "not a plain identifier" in text
    assert "Remedy: fix the named field in the config file; nothing was written." in text


@pytest.mark.parametrize("source_name", ["../../etc", "a/b", "..", "src/../../x"])
def test_path_traversal_in_a_source_name_is_a_config_error(tmp_path, source_name):
    path = orders_config(tmp_path, query__sources={source_name: {"format": "json", "path": "src"}})
    with pytest.raises(ConfigError) as info:
        load_file(path)
    err = info.value
    assert (err.path, err.field) == (str(path), f"query.sources.{source_name}")
    assert "\n" not in str(err) and "plain identifier" in str(err) and "Remedy:" in str(err)


# --- the desired collection cannot be read ----------------------------------------------------


def test_a_missing_source_path_is_a_source_error_the_task_records_as_final(
    spark, warehouse, tmp_path, sqlite_ledger, monkeypatch
):
    ledger = sqlite_ledger
    cfg = new_sink(spark, tmp_path, "nosource", rows=None)  # tmp_path/src never created
    assert not (tmp_path / "src").exists()
    desc = mint.run_mint(ledger, cfg, "run-1", 1, 200).description
    before = snapshot(spark, ledger, cfg)

    with pytest.raises(SourceError) as info:
        write.run_write(spark, ledger, cfg, desc.batch_id)
    text = assert_one_line(info.value, "nosource")
    assert "query.sources.src" in text and str(tmp_path / "src") in text
    assert "fix the source" in text
    assert_nothing_committed(spark, ledger, cfg, before, unstaged=desc.batch_id)
    assert ledger.get_batch(desc.batch_id).state == MINTED

    # through the task entry point: the failure is recorded as final, with the same line
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    with pytest.raises(SourceError) as again:
        tasks.stage_for_run("nosource", "run-1", spark=spark)
    assert tasks.failure_verdict("nosource", "run-1") == (True, str(again.value))
    assert tasks.failure_verdict("nosource", "run-1", desc.batch_id) == (True, str(again.value))
    assert_nothing_committed(spark, ledger, cfg, before, unstaged=desc.batch_id)


@pytest.mark.parametrize(
    "sql, expect",
    [
        ("SELECT k FROM src", "lacks column(s) ['v']"),
        ("SELECT k, v, k * 2 AS extra FROM src", "column(s) ['extra'] that are not in the sink's schema"),
    ],
    ids=["lacks_column", "extra_column"],
)
def test_a_query_result_not_matching_the_schema_is_a_source_error(
    spark, warehouse, tmp_path, sqlite_ledger, sql, expect
):
    ledger = sqlite_ledger
    query = {"sources": {"src": {"format": "json", "path": "src"}}, "sql": sql}
    cfg = new_sink(spark, tmp_path, "mismatch", query=query)
    desc = mint.run_mint(ledger, cfg, "run-1", 1, 200).description
    before = snapshot(spark, ledger, cfg)
    with pytest.raises(SourceError) as info:
        write.run_write(spark, ledger, cfg, desc.batch_id)
    text = assert_one_line(info.value, "mismatch")
    assert expect in text and "query.sql" in text
    assert_nothing_committed(spark, ledger, cfg, before, unstaged=desc.batch_id)


def test_a_changelog_source_without_its_diff_column_is_a_source_error(spark, warehouse, tmp_path, sqlite_ledger):
    ledger = sqlite_ledger
    cfg = new_sink(spark, tmp_path, "nodiff", kind="changelog", rows=[{"k": 1, "v": "a", "ts": 150}])
    desc = mint.run_mint(ledger, cfg, "run-1", 1, 200).description
    before = snapshot(spark, ledger, cfg)
    with pytest.raises(SourceError) as info:
        write.run_write(spark, ledger, cfg, desc.batch_id)
    text = assert_one_line(info.value, "nodiff")
    assert "changelog.source lacks column(s) ['diff']" in text
    assert_nothing_committed(spark, ledger, cfg, before, unstaged=desc.batch_id)


@pytest.mark.parametrize(
    "sql",
    [
        "SELEC k, v FROM src",  # does not parse
        "SELECT k, v FROM nowhere",  # unknown table
        "SELECT k, w AS v FROM src",  # unknown column
    ],
    ids=["parse", "table", "column"],
)
def test_query_sql_that_does_not_run_is_a_source_error(spark, warehouse, tmp_path, sqlite_ledger, sql):
    ledger = sqlite_ledger
    query = {"sources": {"src": {"format": "json", "path": "src"}}, "sql": sql}
    cfg = new_sink(spark, tmp_path, "badsql", query=query)
    desc = mint.run_mint(ledger, cfg, "run-1", 1, 200).description
    before = snapshot(spark, ledger, cfg)
    with pytest.raises(SourceError) as info:
        write.run_write(spark, ledger, cfg, desc.batch_id)
    text = assert_one_line(info.value, "badsql")
    assert "query.sql does not run" in text
    assert_nothing_committed(spark, ledger, cfg, before, unstaged=desc.batch_id)


def test_query_sql_that_is_a_command_is_refused_before_it_runs(spark, warehouse, tmp_path, sqlite_ledger):
    ledger = sqlite_ledger
    cfg = new_sink(spark, tmp_path, "dml")
    m, w, a = run_stages(spark, ledger, cfg, "run-1", 200)
    assert a.outcome == "committed"
    evil = make_sink(
        tmp_path,
        "dml",
        as_of=0,
        query={
            "sources": {"src": {"format": "json", "path": "src"}},
            "sql": f"DELETE FROM delta.`{ShardTable(cfg).path}`",
        },
    )
    desc = mint.run_mint(ledger, evil, "run-2", 1, 300).description
    before = snapshot(spark, ledger, evil)
    with pytest.raises(SourceError) as info:
        write.run_write(spark, ledger, evil, desc.batch_id)
    assert_one_line(info.value, "dml")
    assert_nothing_committed(spark, ledger, evil, before, unstaged=desc.batch_id)
    assert sum(shard_rows(spark, cfg, 199).values()) == len(ROWS)


# --- rows that do not fit become error rows: stored, counted, never dropped -------------------


def test_values_that_do_not_fit_the_type_become_error_rows(spark, warehouse, tmp_path, sqlite_ledger):
    ledger = sqlite_ledger
    rows = [
        {"k": 1, "v": "ok"},
        {"k": "abc", "v": "text"},
        {"k": 1.5, "v": "fraction"},
        {"k": "9223372036854775808", "v": "overflow"},
    ]
    cfg = new_sink(spark, tmp_path, "types", rows=rows)
    m, w, a = run_stages(spark, ledger, cfg, "run-1", 200)
    assert a.outcome == "committed", a.message
    batch = ledger.get_batch(m.description.batch_id)
    assert (batch.rows_ok, batch.rows_err) == (1, 3)
    assert (w.rows_ok, w.rows_err) == (1, 3)

    shard = shard_rows(spark, cfg, 199)
    assert shard[(1, "ok", None)] == 1
    errors = error_rows(shard)
    assert sorted(errors.values()) == [1, 1, 1], errors  # none dropped, each once
    assert sum(shard.values()) == len(rows)
    for raw in ('"abc"', '"1.5"', '"9223372036854775808"'):
        [msg] = [e for e in errors if raw in e]
        assert "column 'k' does not fit bigint" in msg
    assert ledger.get_shard(cfg.name).upper == 200

    # a fraction read as a double (not a string) is an error too, not truncated to 1
    df = spark.createDataFrame([(1.5, "x"), (2.0, "y")], "k double, v string")
    ok, bad = sorted(
        validate(cfg, df, "the result of query.sql", F.lit(1), None).collect(), key=lambda r: r["_error"] is not None
    )
    assert (ok["k"], ok["v"], ok["_error"]) == (2, "y", None)
    assert (bad["k"], bad["v"]) == (None, None)
    assert "column 'k' does not fit bigint" in bad["_error"] and "1.5" in bad["_error"]


def test_nulls_in_a_non_nullable_column_become_error_rows(spark, warehouse, tmp_path, sqlite_ledger):
    ledger = sqlite_ledger
    rows = [{"k": None, "v": "null key"}, {"v": "absent key"}, {"k": 3, "v": None}, {"k": 4, "v": "d"}]
    cfg = new_sink(spark, tmp_path, "nulls", rows=rows)
    m, w, a = run_stages(spark, ledger, cfg, "run-1", 200)
    assert a.outcome == "committed", a.message
    batch = ledger.get_batch(m.description.batch_id)
    assert (batch.rows_ok, batch.rows_err) == (2, 2)

    shard = shard_rows(spark, cfg, 199)
    assert shard[(3, None, None)] == 1 and shard[(4, "d", None)] == 1  # v is nullable
    errors = error_rows(shard)
    assert len(errors) == 2 and sum(errors.values()) == 2
    assert all("column 'k' is null but not nullable" in e for e in errors)
    assert any('"null key"' in e for e in errors) and any('"absent key"' in e for e in errors)


def test_zero_null_and_fractional_diffs_become_error_rows(spark, warehouse, tmp_path, sqlite_ledger):
    ledger = sqlite_ledger
    rows = [
        change(1, "zero", 150, 0),
        change(2, "null", 150, None),
        change(3, "fraction", 150, 1.5),
        change(4, "ok", 150, 2),
        change(5, "later", 250, 0),  # beyond the frontier: waits for the next batch
    ]
    cfg = new_sink(spark, tmp_path, "diffs", kind="changelog", rows=rows)
    m, w, a = run_stages(spark, ledger, cfg, "run-1", 200)
    assert a.outcome == "committed", a.message
    batch = ledger.get_batch(m.description.batch_id)
    assert (batch.rows_ok, batch.rows_err) == (1, 3)

    log = [r.asDict() for r in frames.read_updates(spark, ShardTable(cfg)).collect()]
    assert [(r["k"], r["v"], r["_time"], r["_diff"]) for r in log if r["_error"] is None] == [(4, "ok", 150, 2)]
    errs = [r for r in log if r["_error"] is not None]
    assert sorted((r["_time"], r["_diff"]) for r in errs) == [(150, 1)] * 3
    for v in ("zero", "null", "fraction"):
        [e] = [r["_error"] for r in errs if f'"{v}"' in r["_error"]]
        assert "diff column 'diff' is null, zero or not an integer" in e

    # the next batch picks up the late bad row as an error row as well
    m2, w2, a2 = run_stages(spark, ledger, cfg, "run-2", 300)
    assert a2.outcome == "committed" and ledger.get_batch(m2.description.batch_id).rows_err == 1


def test_non_integer_times_in_a_changelog_become_error_rows(spark, warehouse, tmp_path, sqlite_ledger):
    ledger = sqlite_ledger
    rows = [
        change(1, "text", "abc", 1),
        change(2, "fraction", "150.5", 1),
        change(3, "null", None, 1),
        change(4, "ok", "120", 1),
    ]
    cfg = new_sink(spark, tmp_path, "times", kind="changelog", rows=rows)
    m, w, a = run_stages(spark, ledger, cfg, "run-1", 200)
    assert a.outcome == "committed", a.message
    batch = ledger.get_batch(m.description.batch_id)
    assert (batch.rows_ok, batch.rows_err) == (1, 3)

    log = [r.asDict() for r in frames.read_updates(spark, ShardTable(cfg)).collect()]
    assert [(r["k"], r["v"], r["_time"], r["_diff"]) for r in log if r["_error"] is None] == [(4, "ok", 120, 1)]
    errs = [r for r in log if r["_error"] is not None]
    assert len(errs) == 3 and all(r["_diff"] == 1 and 0 <= r["_time"] < 200 for r in errs)
    for v in ("text", "fraction", "null"):
        [e] = [r["_error"] for r in errs if f'"{v}"' in r["_error"]]
        assert "time column 'ts' is null or not an integer" in e


# --- a desired frontier that is not ahead of the shard ----------------------------------------


def test_a_frontier_not_ahead_of_the_upper_mints_nothing(tmp_path, ledger):
    cfg = make_sink(tmp_path, "behind", as_of=100)
    ledger.ensure_shard(cfg.name, cfg.as_of)
    ledger.compare_and_set_upper(cfg.name, 0, 300)  # as if batches up to 300 were committed
    ids_before = [b.batch_id for b in ledger.batches(cfg.name)]

    for frontier in (50, 100, 299, 300):
        m = mint.run_mint(ledger, cfg, f"late-{frontier}", 1, frontier)
        assert m.description is None
        assert "nothing to do" in m.message and "already covered" in m.message
        assert f"desired frontier {iso(frontier)} is not ahead of lower {iso(300)}" in m.message
        assert "\n" not in m.message and "sink=behind" in m.message
    assert ledger.get_shard(cfg.name).upper == 300
    assert [b.batch_id for b in ledger.batches(cfg.name)] == ids_before == []
    assert ledger.batch_of_run(cfg.name, "late-300") is None


# --- the ledger database is unreachable -----------------------------------------------------


def test_an_unreachable_metadata_database_is_retryable_and_hides_the_password():
    with pytest.raises(MetadataUnavailable) as info:
        Ledger(BAD_PG_URL)
    err = info.value
    assert isinstance(err, Retryable)
    text = str(err)
    assert "secret" not in text and "nobody:***@127.0.0.1:1/none" in text
    assert "unreachable" in text
    assert "Remedy: check RECONCILE_METADATA_URL" in text and "nothing was committed" in text


def test_an_unreachable_metadata_database_message_is_one_line():
    with pytest.raises(MetadataUnavailable) as info:
        Ledger(BAD_PG_URL)
    text = str(info.value)
    assert "\n" not in text and "\t" not in text, repr(text)


def test_every_store_call_after_the_database_went_away_is_metadata_unavailable(tmp_path):
    ledger = Ledger(BAD_PG_URL, auto_migrate=False)  # the database went away after start
    try:
        cfg = make_sink(tmp_path, "gone")
        with pytest.raises(MetadataUnavailable):  # writes go through tx(): typed
            mint.run_mint(ledger, cfg, "run-1", 1, 200)
        with pytest.raises(MetadataUnavailable):
            ledger.get_shard("gone")
        for read in (
            lambda: ledger.get_batch("b"),
            lambda: ledger.batch_of_run("gone", "run-1"),
            lambda: ledger.batches("gone"),
            lambda: ledger.committed_batch("gone", 0),
        ):
            try:
                read()
            except MetadataUnavailable as exc:
                assert "secret" not in str(exc) and "\n" not in str(exc)
            except SQLAlchemyError as exc:
                pytest.fail(f"untyped {type(exc).__name__}: {str(exc).splitlines()[0]}")
    finally:
        ledger.dispose()


def test_status_needs_action_while_the_sink_s_config_does_not_load(tmp_path, sqlite_ledger, monkeypatch, capsys):
    """A config file that stops validating: Airflow replaces the sink's DAG by a placeholder,
    so no run writes, fails or records anything in the ledger; ``status`` says so (exit 1)."""
    import yaml

    from reconcile import cli

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    make_sink(tmp_path, "broken")
    sqlite_ledger.ensure_shard("broken", 100)
    assert cli.main(["status", "broken"]) == 0 and "NEEDS ACTION" not in capsys.readouterr().out
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), "partitions": 0}))
    assert cli.main(["status", "broken"]) == 1
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "NEEDS ACTION" in ln)
    assert line.startswith(
        "  NEEDS ACTION: the sink's config does not load, so Airflow runs no DAG broken (it shows "
        f"invalid_sink_config__broken instead) and nothing is written: sink 'broken': config {path}: field 'partitions'"
    ), line
    assert "Remedy: fix the named field in the config file" in line
    assert cli.main(["status", "broken", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["needs_action"] == [line.removeprefix("  NEEDS ACTION: ")]


# --- no shard row / no batch ------------------------------------------------------------------


def test_a_missing_shard_row_is_refused_and_tasks_of_a_run_without_a_batch_touch_nothing(
    spark, warehouse, tmp_path, ledger, monkeypatch
):
    cfg = make_sink(tmp_path, "ghost")
    with pytest.raises(ShardNotFound) as info:
        ledger.get_shard("ghost")
    text = assert_one_line(info.value, "ghost")
    assert (
        "no shard row" in text
        and "`airflow dags unpause ghost && airflow dags trigger ghost`" in text
        and "`python -m reconcile recover ghost`" in text
    )
    with pytest.raises(ShardNotFound) as info:
        sync(ledger, ShardTable(cfg))
    assert_one_line(info.value, "ghost")

    # the Airflow tasks of a run that minted nothing say so, and touch nothing
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    assert tasks.commit_for_run("ghost", "run-1") == "run run-1 minted no batch for sink 'ghost': nothing to append"
    assert tasks.stage_for_run("ghost", "run-1") == "run run-1 minted no batch for sink 'ghost': nothing to write"
    with pytest.raises(ShardNotFound):
        ledger.get_shard("ghost")
    assert not ShardTable(cfg).exists()

    # a batch id that is not in the ledger
    with pytest.raises(BatchNotFound) as info:
        append.run_append(ledger, cfg, "0-doesnotexist")
    text = str(info.value)
    assert "\n" not in text and "'0-doesnotexist'" in text and "Remedy: a new run's mint describes a new batch" in text
    assert not ShardTable(cfg).exists()


def test_a_batch_missing_from_the_ledger_names_the_sink(spark, warehouse, tmp_path, sqlite_ledger):
    cfg = make_sink(tmp_path, "ghost")
    with pytest.raises(BatchNotFound) as info:
        append.run_append(sqlite_ledger, cfg, "0-doesnotexist")
    assert_one_line(info.value, "ghost")


def test_an_append_before_the_write_is_refused(spark, warehouse, tmp_path, sqlite_ledger):
    ledger = sqlite_ledger
    cfg = new_sink(spark, tmp_path, "unstaged")
    desc = mint.run_mint(ledger, cfg, "run-1", 1, 200).description
    before = snapshot(spark, ledger, cfg)
    with pytest.raises(StagedBatchInvalid) as info:
        append.run_append(ledger, cfg, desc.batch_id)
    text = assert_one_line(info.value, "unstaged")
    assert "minted but never staged" in text and "its write stages the batch" in text
    assert_nothing_committed(spark, ledger, cfg, before, unstaged=desc.batch_id)


# --- staged batches that do not match their manifest ------------------------------------------


def test_a_missing_or_extra_staged_file_is_refused_until_the_write_restages(spark, warehouse, tmp_path, sqlite_ledger):
    ledger = sqlite_ledger
    cfg = new_sink(spark, tmp_path, "lostpart")
    desc, files = staged_batch(spark, ledger, cfg)
    before = snapshot(spark, ledger, cfg)
    root = Path(stage_dir(ledger, cfg, desc.batch_id))
    victim = sorted(files)[0]
    content = (root / victim).read_bytes()
    (root / victim).unlink()

    with pytest.raises(StagedBatchInvalid) as info:
        append.run_append(ledger, cfg, desc.batch_id)
    text = assert_one_line(info.value, "lostpart")
    assert "misses file(s)" in text and victim in text and desc.batch_id in text
    assert "stage the batch anew" in text
    assert_nothing_committed(spark, ledger, cfg, before)
    assert ledger.get_batch(desc.batch_id).state == STAGED

    # the file is back, but an unexpected extra one is there: refused as well
    (root / victim).write_bytes(content)
    extra = root / victim.split("/")[0] / "part-99999-extra.snappy.parquet"
    extra.write_bytes(content)
    with pytest.raises(StagedBatchInvalid) as info:
        append.run_append(ledger, cfg, desc.batch_id)
    text = assert_one_line(info.value, "lostpart")
    assert "does not match its manifest" in text and "unexpected" in text and extra.name in text
    assert_nothing_committed(spark, ledger, cfg, before)

    # the remedy: clear 'write' (re-stages), then 'append'
    assert write.run_write(spark, ledger, cfg, desc.batch_id).outcome == "staged"
    assert append.run_append(ledger, cfg, desc.batch_id).outcome == "committed"
    assert ledger.get_shard(cfg.name).upper == 200
    assert shard_rows(spark, cfg, 199) == Counter({(r["k"], r["v"], None): 1 for r in ROWS})
    assert leftover_staged(ledger, cfg) == []


def test_a_missing_staged_folder_of_an_empty_batch_is_refused(spark, warehouse, tmp_path, sqlite_ledger):
    ledger = sqlite_ledger
    query = {"sources": {"src": {"format": "json", "path": "src"}}, "sql": "SELECT k, v FROM src WHERE false"}
    cfg = new_sink(spark, tmp_path, "emptylost", query=query)
    desc = mint.run_mint(ledger, cfg, "run-1", 1, 200).description
    w = write.run_write(spark, ledger, cfg, desc.batch_id)
    assert (w.outcome, w.rows_ok, w.rows_err) == ("staged", 0, 0)
    before = snapshot(spark, ledger, cfg)
    files.delete_path(ShardTable(cfg).staging_path(desc.batch_id))
    with pytest.raises(StagedBatchInvalid) as info:
        append.run_append(ledger, cfg, desc.batch_id)
    assert_one_line(info.value, "emptylost")
    assert_nothing_committed(spark, ledger, cfg, before)


def test_a_corrupted_staged_file_is_refused_whatever_its_size(spark, warehouse, tmp_path, sqlite_ledger):
    ledger = sqlite_ledger
    cfg = new_sink(spark, tmp_path, "corrupt")
    desc, files = staged_batch(spark, ledger, cfg)
    before = snapshot(spark, ledger, cfg)
    root = Path(stage_dir(ledger, cfg, desc.batch_id))
    first, *rest = sorted(files)

    # garbage of the same length: the sizes match, the content does not read
    (root / first).write_bytes(b"\x00garbage" * (files[first] // 8) + b"x" * (files[first] % 8))
    assert (root / first).stat().st_size == files[first]
    with pytest.raises(StagedBatchInvalid) as info:
        append.run_append(ledger, cfg, desc.batch_id)
    text = assert_one_line(info.value, "corrupt")
    assert f"staged batch {desc.batch_id}" in text and "changed after it was staged" in text and first in text
    assert_nothing_committed(spark, ledger, cfg, before)

    # garbage of another length: refused from the manifest's sizes, before reading
    (root / first).write_bytes(b"garbage")
    with pytest.raises(StagedBatchInvalid) as info:
        append.run_append(ledger, cfg, desc.batch_id)
    text = assert_one_line(info.value, "corrupt")
    assert "does not match its manifest" in text and first in text
    assert_nothing_committed(spark, ledger, cfg, before)
    assert ledger.get_batch(desc.batch_id).state == STAGED


def test_a_manifest_not_matching_its_files_is_refused_and_a_wrong_checksum_is_found_by_the_check(
    spark, warehouse, tmp_path, sqlite_ledger
):
    ledger = sqlite_ledger
    cfg = new_sink(spark, tmp_path, "manifest", partitions=8)  # 4 rows: some partitions are empty
    desc, files = staged_batch(spark, ledger, cfg)
    before = snapshot(spark, ledger, cfg)
    original = json.loads(ledger.get_batch(desc.batch_id).manifest)
    p, part = next((p, part) for p, part in sorted(original["parts"].items()) if part["rows"])

    # rows are checked against the files' footers, contents against their digests (no row read)
    tampered = json.loads(json.dumps(original))
    tampered["parts"][p]["rows"] = part["rows"] + 1
    set_batch(ledger, desc.batch_id, manifest=json.dumps(tampered))
    with pytest.raises(StagedBatchInvalid) as info:
        append.run_append(ledger, cfg, desc.batch_id)
    text = assert_one_line(info.value, "manifest")
    assert f"staged partition {p} of batch {desc.batch_id}" in text and "the manifest says" in text
    assert str(part["rows"] + 1) in text
    assert_nothing_committed(spark, ledger, cfg, before)
    tampered = json.loads(json.dumps(original))
    rel = next(iter(part["digests"]))
    tampered["parts"][p]["digests"][rel] = "0" * 64
    set_batch(ledger, desc.batch_id, manifest=json.dumps(tampered))
    with pytest.raises(StagedBatchInvalid) as info:
        append.run_append(ledger, cfg, desc.batch_id)
    assert "changed after it was staged" in assert_one_line(info.value, "manifest") and rel in str(info.value)
    assert_nothing_committed(spark, ledger, cfg, before)

    # a partition that the manifest says is empty, but holds the rows
    empty = next(q for q, part in sorted(original["parts"].items()) if not part["rows"])
    tampered = json.loads(json.dumps(original))
    tampered["parts"][empty]["rows"] = 1
    set_batch(ledger, desc.batch_id, manifest=json.dumps(tampered))
    with pytest.raises(StagedBatchInvalid) as info:
        append.run_append(ledger, cfg, desc.batch_id)
    assert f"staged partition {empty} of batch" in assert_one_line(info.value, "manifest")
    assert_nothing_committed(spark, ledger, cfg, before)

    # a checksum that does not describe the rows: the append (no row read) commits the files it
    # staged, and the deep check (rows read back) names the batch and partition
    tampered = json.loads(json.dumps(original))
    tampered["parts"][p]["checksum"] = str(int(part["checksum"]) + 1)
    set_batch(ledger, desc.batch_id, manifest=json.dumps(tampered))
    assert append.run_append(ledger, cfg, desc.batch_id).outcome == "committed"
    assert check.violations(ledger, cfg) == []  # the log matches the manifest: files and rows
    found = check.violations(ledger, cfg, spark=spark)
    assert len(found) == 1 and f"batch {desc.batch_id}" in found[0] and f"partition {p}" in found[0], found


@pytest.mark.parametrize("manifest", [None, "{}", "{not json"], ids=["null", "no_parts", "not_json"])
def test_a_malformed_manifest_is_staged_batch_invalid(spark, warehouse, tmp_path, sqlite_ledger, manifest):
    ledger = sqlite_ledger
    cfg = new_sink(spark, tmp_path, "nomanifest")
    desc = mint.run_mint(ledger, cfg, "run-1", 1, 200).description
    set_batch(ledger, desc.batch_id, state=STAGED, manifest=manifest)
    before = snapshot(spark, ledger, cfg)
    with pytest.raises(StagedBatchInvalid) as info:
        append.run_append(ledger, cfg, desc.batch_id)
    assert_one_line(info.value, "nomanifest")
    assert_nothing_committed(spark, ledger, cfg, before)


# --- stale batches and lowers that do not increase --------------------------------------------


def test_a_stale_staged_batch_of_an_older_lower_is_covered_and_its_files_removed(
    spark, warehouse, tmp_path, sqlite_ledger
):
    ledger = sqlite_ledger
    cfg = new_sink(spark, tmp_path, "stale")
    a, _ = staged_batch(spark, ledger, cfg, "run-a", 200)
    m, w, b = run_stages(spark, ledger, cfg, "run-b", 300)  # a newer run covers [0, 300)
    assert b.outcome == "committed" and m.description.lower == a.lower
    assert ledger.get_batch(a.batch_id).state == SUPERSEDED
    before = snapshot(spark, ledger, cfg)
    assert before.upper == 300

    result = append.run_append(ledger, cfg, a.batch_id)
    assert result.outcome == "covered", result.message
    assert "already covered" in result.message and "\n" not in result.message
    assert_nothing_committed(spark, ledger, cfg, before, unstaged=a.batch_id)
    assert a.batch_id not in files.list_dirs(ShardTable(cfg).staging_root)
    # rewriting the stale batch is a no-op as well
    assert write.run_write(spark, ledger, cfg, a.batch_id).outcome == "skipped"
    assert_nothing_committed(spark, ledger, cfg, before, unstaged=a.batch_id)

    lowers = [c.lower for c in batch_commits(ShardTable(cfg).history_since(-1)[1])]
    assert lowers == [0] and len(set(lowers)) == len(lowers)
    assert shard_rows(spark, cfg, 299) == Counter({(r["k"], r["v"], None): 1 for r in ROWS})


def test_a_lower_behind_the_upper_is_never_committed(spark, warehouse, tmp_path, sqlite_ledger):
    ledger = sqlite_ledger
    cfg = new_sink(spark, tmp_path, "oldlower", as_of=100)
    a, _ = staged_batch(spark, ledger, cfg, "run-a", 400)  # [100, 400), staged
    m, w, b = run_stages(spark, ledger, cfg, "run-b", 300)  # [100, 300) commits
    assert b.outcome == "committed"
    # a stale writer that never saw the supersession: its ledger row still says 'staged'
    set_batch(ledger, a.batch_id, state=STAGED, message=None)
    before = snapshot(spark, ledger, cfg)
    assert before.upper == 300 and [c[0] for c in before.commits] == [100]

    with pytest.raises(LostRace) as info:
        append.run_append(ledger, cfg, a.batch_id)
    assert isinstance(info.value, DescriptionOutdated)
    text = assert_one_line(info.value, "oldlower")
    assert f"upper to {iso(300)}" in text and "nothing was written" in text and a.batch_id in text
    # the rest [300, 400) comes with a new run (the DAG unpaused first: a paused DAG's run never starts)
    assert "`airflow dags unpause oldlower && airflow dags trigger oldlower`" in text
    assert_nothing_committed(spark, ledger, cfg, before, unstaged=a.batch_id)
    assert ledger.get_batch(a.batch_id).state == SUPERSEDED

    # Delta itself refuses a batch commit whose lower (txnVersion) is not above the last one
    staged = tmp_path / "warehouse" / cfg.name / "batches" / "fake"
    spark.createDataFrame(
        [{"k": 9, "v": "zz", "_error": None, "_time": 150, "_diff": 1}], frames.schema(cfg)
    ).write.parquet(str(staged))
    files = [(f"batches/fake/{f.name}", f.stat().st_size, {"numRecords": 1}) for f in staged.glob("*.parquet")]
    for lower in (50, 100):
        meta = {"batch_id": f"fake-{lower}", "lower": lower, "upper": 350, "run_id": "x"}
        assert ShardTable(cfg).commit_files(files, meta, lower) is None
        assert_nothing_committed(spark, ledger, cfg, before)
    assert sync(ledger, ShardTable(cfg)).upper == 300
    assert (9, "zz", None) not in shard_rows(spark, cfg, 399)


# --- the Delta table's schema changed behind the sink's back ----------------------------------


@pytest.mark.slow  # three rounds of batches, Spark rewriting the table twice
def test_a_schema_changed_behind_the_sinks_back_is_refused_until_restored(spark, warehouse, tmp_path, sqlite_ledger):
    ledger = sqlite_ledger
    cfg = new_sink(spark, tmp_path, "altered")
    desc, _ = staged_batch(spark, ledger, cfg)
    good_version = ShardTable(cfg).latest_version()
    spark.sql(f"ALTER TABLE delta.`{ShardTable(cfg).path}` ADD COLUMNS (extra STRING)")
    before = snapshot(spark, ledger, cfg)
    assert before.version == good_version + 1

    with pytest.raises(ShardSchemaChanged) as info:
        append.run_append(ledger, cfg, desc.batch_id)
    text = assert_one_line(info.value, "altered")
    assert "'extra'" in text and "RESTORE" in text
    assert_nothing_committed(spark, ledger, cfg, before)

    nxt = mint.run_mint(ledger, cfg, "run-2", 1, 300).description
    with pytest.raises(ShardSchemaChanged):
        write.run_write(spark, ledger, cfg, nxt.batch_id)
    assert_nothing_committed(spark, ledger, cfg, before, unstaged=nxt.batch_id)

    # the remedy works: RESTORE to the last version the sink wrote, then the sink goes on
    spark.sql(f"RESTORE TABLE delta.`{ShardTable(cfg).path}` TO VERSION AS OF {good_version}")
    m, w, a = run_stages(spark, ledger, cfg, "run-3", 300)
    assert a.outcome == "committed", a.message
    assert ledger.get_shard(cfg.name).upper == 300
    assert shard_rows(spark, cfg, 299) == Counter({(r["k"], r["v"], None): 1 for r in ROWS})


def test_a_spark_error_after_the_source_checks_stays_spark_s_error(spark, monkeypatch):
    """The source checks quiet PySpark's error loggers while they probe casts; they must not
    create those loggers as plain ones, or PySpark turns every later Spark error that carries a
    query context (here an overflow) into a TypeError of its logging."""
    import logging

    from pyspark.errors import ArithmeticException

    from reconcile.kinds.decode import _quiet_analysis

    for name in ("DataFrameQueryContextLogger", "SQLQueryContextLogger"):  # as in a fresh process
        monkeypatch.delitem(logging.Logger.manager.loggerDict, name, raising=False)
    with _quiet_analysis():
        pass
    with pytest.raises(ArithmeticException, match="ARITHMETIC_OVERFLOW"):
        spark.range(3).select(F.lit(2**62) * F.col("id") * 4).collect()
