"""Foreign writes are repaired by the next run, for every kind (an upsert shard: whatever keys they touch), and
every report calls them repaired only once they are (real Spark, Delta, delta-rs as the foreign
writer; the shard compared with the plain-Python model in tests/upsert_model.py)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from helpers import run_stages, shard_as_of, write_json_rows
from reconcile import cli
from reconcile.storage.delta import ShardTable
from upsert_model import HINT, UpsertModel, check_against, cmd, ok_rows, upsert_sink

DELETE = {"delete": {"column": "op", "values": ["delete"]}}


def _feed(tmp_path, rows):
    write_json_rows(tmp_path / "feed", list(rows) + [{**HINT, "op": "set"}])


def _foreign(cfg, *, delete: str | None = None, rows: list[tuple] = (), overwrite_same: bool = False) -> None:
    """A foreign writer (delta-rs): delete rows by a predicate, append ``(k, v, t, diff)`` rows, or
    rewrite the whole table with the same rows."""
    from deltalake import DeltaTable, write_deltalake

    path = ShardTable(cfg).path
    if delete:
        DeltaTable(path).delete(delete)
    if rows:
        k, v, t, d = zip(*rows, strict=True)
        table = pa.table(
            {
                "k": pa.array(k, pa.int64()),
                "v": pa.array(v, pa.string()),
                "_error": pa.array([None] * len(k), pa.string()),
                "_time": pa.array(t, pa.int64()),
                "_diff": pa.array(d, pa.int64()),
            }
        )
        for f in DeltaTable(path).schema().to_arrow():  # the shard's other columns (its stored row key): null
            if f.name not in table.column_names:
                table = table.append_column(f.name, pa.nulls(len(k), pa.field(f).type))
        write_deltalake(path, table, mode="append")
    if overwrite_same:
        write_deltalake(path, DeltaTable(path).to_pyarrow_table(), mode="overwrite")


@pytest.fixture(params=["local"])
def drilled(request, spark, tmp_path, sqlite_ledger, monkeypatch):
    """Six batches of an upsert sink, in the warehouse the test asks for (``local`` or ``s3``)."""
    request.getfixturevalue("warehouse" if request.param == "local" else "s3_warehouse")
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = upsert_sink(tmp_path, "ups_drift", upsert=DELETE)
    model = UpsertModel(delete_field="op", delete_values=("delete",))
    frontier = 100
    feed = [cmd(k, f"v{k}", 110 + k, k, op="set") for k in range(20)]
    for i in range(6):
        lower, upper = frontier, frontier + 100
        off = 100 + 10 * i
        feed += [
            cmd(i % 20, f"u{i}", lower + 5, off + 1, op="set"),
            cmd((i + 3) % 20, None, lower + 6, off + 2, op="delete"),
            cmd((i + 5) % 20, f"x{i}", lower + 7, off + 3, op="set"),
            cmd((i + 5) % 20, f"y{i}", lower + 7, off + 4, op="set"),  # same (key, time): higher offset wins
            cmd(i % 20, f"u{i}", lower + 5, off + 1, op="set"),  # a replay
        ]
        if i:
            feed.append(cmd((i + 11) % 20, f"late{i}", lower - 50, off + 5, op="set"))  # late
        _feed(tmp_path, feed)
        run_stages(spark, sqlite_ledger, cfg, f"r{i}", upper)
        model.batch(feed, lower, upper)
        frontier = upper
    check_against(spark, cfg, model, [frontier - 1])
    return cfg, model, feed, frontier


def _run(spark, ledger, cfg, model, feed, lower, tmp_path, extra=()):
    feed = feed + list(extra)
    _feed(tmp_path, feed)
    run_stages(spark, ledger, cfg, f"run-{lower}", lower + 100)
    model.batch(feed, lower, lower + 100)
    return feed, lower + 100


def _report(capsys, *args) -> tuple[int, str]:
    code = cli.main(list(args))
    return code, capsys.readouterr().out


@pytest.mark.parametrize("drilled", ["local", "s3"], indirect=True)
def test_the_next_run_repairs_every_shape_of_foreign_write_and_every_report_agrees(
    drilled, spark, sqlite_ledger, tmp_path, capsys
):
    cfg, model, feed, frontier = drilled
    state = model.as_of(frontier - 1)
    assert {17, 13} <= {k for k, _v, _e in state}
    # deleted two keys' whole history, added a key the feed never had, changed a value, deleted and
    # re-added a key, rewrote the files without changing a row
    _foreign(cfg, delete="k = 17 OR k = 13")
    v3 = state_value(state, 3)
    _foreign(cfg, rows=[(999, "zz_foreign", 150, 1), (3, v3, frontier - 1, -1), (3, "tampered", frontier - 1, 1)])
    _foreign(cfg, delete="k = 4")
    _foreign(cfg, rows=[(4, state_value(state, 4), 150, 1)])
    _foreign(cfg, overwrite_same=True)

    # known to differ, and the next batch repairs it: exit 4 (docs/operating.md, "Exit codes")
    code, out = _report(capsys, "check", cfg.name)
    assert code == 4 and "not yet repaired" in out and "repaired at version" not in out, out
    assert "5 foreign Delta version(s) not yet repaired" in out.splitlines()[-1], out
    code, out = _report(capsys, "status", cfg.name, "--json")
    assert code == 4 and len(json.loads(out)["foreign_unrepaired"]) == 5
    code, out = _report(capsys, "check", cfg.name, "--verify")
    assert code == 4 and "does NOT match the feed's latest command per key" in out, out
    assert "VIOLATION" not in out and "its retention" not in out, out
    assert '{"k": 13}' in out and "(the next batch recomputes them from the feed)" in out, out
    assert 'holds key(s) {"k": 999} that the feed never had: foreign Delta versions ' in out, out

    feed, frontier = _run(
        spark, sqlite_ledger, cfg, model, feed, frontier, tmp_path, [cmd(1, "after", frontier + 1, 999, op="set")]
    )
    check_against(spark, cfg, model, [frontier - 1])
    code, out = _report(capsys, "check", cfg.name)
    assert code == 0 and out.count("repaired at version") == 5 and "not yet repaired" not in out, out
    code, out = _report(capsys, "status", cfg.name, "--json")
    data = json.loads(out)
    assert data["foreign_unrepaired"] == []
    code, out = _report(capsys, "check", cfg.name, "--verify")
    assert code == 0 and "VIOLATION" not in out, out
    keys = len({c["k"] for c in feed})
    assert f"matches the feed's latest command per key ({keys} key(s) with a command)" in out, out
    assert "self-consistency" in out
    # the run's line and the page call the drift repaired (grey), not red
    from reconcile.airflow import tasks, ui

    _, line = tasks.batch_line(cfg.name, f"run-{frontier - 100}", None)
    assert "drift_rows=" in line and "(repaired)" in line, line
    page = ui.render_sink(cfg.name)
    assert "<span class=done>drift" in page and "<span class=bad>drift" not in page


def test_a_foreign_write_an_older_batch_read_without_repairing_it_is_not_called_repaired_until_a_batch_does(
    drilled, spark, sqlite_ledger, tmp_path, capsys, monkeypatch
):
    """A shard written before upsert batches repaired by key: its batch read the foreign version
    but repaired nothing (no drift record); the reports say so, and the next batch repairs it."""
    from reconcile.sink import drift

    cfg, model, feed, frontier = drilled
    _foreign(cfg, delete="k = 17")
    with monkeypatch.context() as m:  # today's batch, as the code before it wrote it: no repair, no record
        m.setattr(drift.Drift, "record", lambda self, cfg, corr: None)
        m.setattr(drift, "find", lambda *a, **k: drift.Drift())
        feed, frontier = _run(spark, sqlite_ledger, cfg, model, feed, frontier, tmp_path)
    assert 17 not in {k for k, _v, _e in ok_rows(shard_as_of(cfg, frontier - 1))}  # left in place
    code, out = _report(capsys, "check", cfg.name)
    assert "repaired at version" not in out and "not yet repaired" in out, out
    code, out = _report(capsys, "status", cfg.name, "--json")
    assert len(json.loads(out)["foreign_unrepaired"]) == 1

    feed, frontier = _run(spark, sqlite_ledger, cfg, model, feed, frontier, tmp_path)
    check_against(spark, cfg, model, [frontier - 1])
    code, out = _report(capsys, "check", cfg.name)
    assert "repaired at version" in out and "not yet repaired" not in out, out


def state_value(state, k):
    return next(v for (key, v, _e) in state if key == k)


@pytest.mark.slow  # the quick tier keeps this module's lighter tests
def test_a_key_the_feed_no_longer_holds_is_not_repairable_and_said_so_until_its_command_returns(
    drilled, spark, sqlite_ledger, tmp_path, capsys
):
    cfg, model, feed, frontier = drilled
    state = model.as_of(frontier - 1)
    # retention dropped key 18's commands from the feed; then a foreign writer deleted its rows
    kept = [c for c in feed if c["k"] != 18]
    _foreign(cfg, delete="k = 18")
    _feed(tmp_path, kept)
    run_stages(spark, sqlite_ledger, cfg, "r-retention", frontier + 100)
    got = ok_rows(shard_as_of(cfg, frontier + 99))
    assert (18, state_value(state, 18), None) not in got  # not invented
    code, out = _report(capsys, "check", cfg.name)
    assert "not repairable" in out and "repaired at version" not in out, out
    code, out = _report(capsys, "status", cfg.name, "--json")
    assert [f["version"] for f in json.loads(out)["foreign_unrepaired"]]

    # the key's last command is put back in the feed: the next batch repairs it
    _feed(tmp_path, feed)
    run_stages(spark, sqlite_ledger, cfg, "r-back", frontier + 200)
    got = ok_rows(shard_as_of(cfg, frontier + 199))
    assert (18, state_value(state, 18), None) in got
    code, out = _report(capsys, "check", cfg.name)
    assert "repaired at version" in out and "not repairable" not in out, out


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("kind", ["query", "changelog"])
def test_query_and_changelog_sinks_repair_every_shape_of_foreign_write_and_reports_agree(
    kind, where, request, spark, tmp_path, sqlite_ledger, monkeypatch, capsys
):
    from helpers import CHANGELOG_NEW, change, changelog_model, make_sink, model_query, normalize_errors

    request.getfixturevalue("warehouse" if where == "local" else "s3_warehouse")
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = make_sink(tmp_path, f"drift_{kind}", kind)
    if kind == "query":
        rows = [{"k": k, "v": f"v{k}"} for k in range(8)]
        write_json_rows(tmp_path / "src", rows)

        def model(t):
            return model_query(rows, cfg)

        runs = [(200, None), (300, None)]
    else:
        runs = CHANGELOG_NEW[:2]

        def model(t):
            return changelog_model(runs, t)

    log: list[dict] = []
    for frontier, new in runs:
        if new is not None:
            log += new
            write_json_rows(tmp_path / "log", log)
        run_stages(spark, sqlite_ledger, cfg, f"r{frontier}", frontier)
    state = normalize_errors(shard_as_of(cfg, 299), cfg)
    assert state == model(299)
    some = sorted(k for k, _v, _e in state)
    _foreign(cfg, delete=f"k = {some[0]}")
    _foreign(cfg, rows=[(999, "zz_foreign", 150, 1), (some[-1], "tampered", 299, 1)])
    _foreign(cfg, overwrite_same=True)
    code, out = _report(capsys, "check", cfg.name)
    assert code == 4 and out.count("; not yet repaired") == 3, out
    assert out.splitlines()[-1].endswith(
        "; 3 foreign Delta version(s) not yet repaired (3, 4, 5): the shard differs "
        "from what its batches committed until the next batch repairs them"
    ), out

    if kind == "changelog":
        runs.append((400, [change(1, "a3", 350, 1)]))
        log += runs[-1][1]
        write_json_rows(tmp_path / "log", log)
    run_stages(spark, sqlite_ledger, cfg, "r400", 400)
    assert normalize_errors(shard_as_of(cfg, 399), cfg) == model(399)
    code, out = _report(capsys, "check", cfg.name)
    assert code == 0 and out.count("repaired at version") == 3 and "not yet repaired" not in out, out
    code, out = _report(capsys, "status", cfg.name, "--json")
    assert json.loads(out)["foreign_unrepaired"] == []
    code, out = _report(capsys, "check", cfg.name, "--verify")
    assert code == 0 and "the current state verifies" in out and "against the source" in out, out
