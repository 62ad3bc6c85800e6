"""Foreign writes to an upsert shard are repaired by the next run, whatever keys they touch, and
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
        write_deltalake(path, table, mode="append")
    if overwrite_same:
        write_deltalake(path, DeltaTable(path).to_pyarrow_table(), mode="overwrite")


@pytest.fixture
def drilled(spark, warehouse, tmp_path, sqlite_store, monkeypatch):
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
        run_stages(spark, sqlite_store, cfg, f"r{i}", upper)
        model.batch(feed, lower, upper)
        frontier = upper
    check_against(spark, cfg, model, [frontier - 1])
    return cfg, model, feed, frontier


def _run(spark, store, cfg, model, feed, lower, tmp_path, extra=()):
    feed = feed + list(extra)
    _feed(tmp_path, feed)
    run_stages(spark, store, cfg, f"run-{lower}", lower + 100)
    model.batch(feed, lower, lower + 100)
    return feed, lower + 100


def _report(capsys, *args) -> tuple[int, str]:
    code = cli.main(list(args))
    return code, capsys.readouterr().out


def test_the_next_run_repairs_every_shape_of_foreign_write_and_every_report_agrees(
    drilled, spark, sqlite_store, tmp_path, capsys
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

    code, out = _report(capsys, "check", cfg.name)
    assert code == 0 and "not yet repaired" in out and "repaired at version" not in out, out
    code, out = _report(capsys, "status", cfg.name, "--json")
    assert len(json.loads(out)["foreign_unrepaired"]) == 5

    feed, frontier = _run(spark, sqlite_store, cfg, model, feed, frontier, tmp_path, [cmd(1, "after", frontier + 1, 999, op="set")])
    check_against(spark, cfg, model, [frontier - 1])
    code, out = _report(capsys, "check", cfg.name)
    assert code == 0 and out.count("repaired at version") == 5 and "not yet repaired" not in out, out
    code, out = _report(capsys, "status", cfg.name, "--json")
    data = json.loads(out)
    assert data["foreign_unrepaired"] == []
    code, out = _report(capsys, "check", cfg.name, "--verify")
    assert code == 0 and "VIOLATION" not in out, out
    assert "the feed's latest command per key" in out, out


def state_value(state, k):
    return next(v for (key, v, _e) in state if key == k)


def test_a_key_the_feed_no_longer_holds_is_not_repairable_and_said_so_until_its_command_returns(
    drilled, spark, sqlite_store, tmp_path, capsys
):
    cfg, model, feed, frontier = drilled
    state = model.as_of(frontier - 1)
    # retention dropped key 18's commands from the feed; then a foreign writer deleted its rows
    kept = [c for c in feed if c["k"] != 18]
    _foreign(cfg, delete="k = 18")
    _feed(tmp_path, kept)
    run_stages(spark, sqlite_store, cfg, "r-retention", frontier + 100)
    got = ok_rows(shard_as_of(cfg, frontier + 99))
    assert (18, state_value(state, 18), None) not in got  # not invented
    code, out = _report(capsys, "check", cfg.name)
    assert "not repairable" in out and "repaired at version" not in out, out
    code, out = _report(capsys, "status", cfg.name, "--json")
    assert [f["version"] for f in json.loads(out)["foreign_unrepaired"]]

    # the key's last command is put back in the feed: the next batch repairs it
    _feed(tmp_path, feed)
    run_stages(spark, sqlite_store, cfg, "r-back", frontier + 200)
    got = ok_rows(shard_as_of(cfg, frontier + 199))
    assert (18, state_value(state, 18), None) in got
    code, out = _report(capsys, "check", cfg.name)
    assert "repaired at version" in out and "not repairable" not in out, out
