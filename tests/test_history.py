"""``history`` (type-2 versions) and ``diff`` (changes between two times) of query, changelog and
upsert sinks, over randomized histories, before and after compaction; the history view run by
Spark and by DuckDB (``delta_scan``) and the CLI.

Every expectation comes from plain-Python models of what each run wrote (the source snapshots,
``helpers.changelog_model``, ``upsert_model.UpsertModel``), evaluated at every millisecond:
a version is a maximal interval of constant non-zero count, never read from the code under test.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import make_sink, run_stages, write_json_rows
from history_model import (
    AS_OF,
    changelog_shard,
    check_diffs,
    duckdb_rows,
    model_diff,
    model_versions,
    numbered_per_key,
    query_shard,
    same_history_everywhere,
    spark_history,
    upsert_shard,
)
from reconcile import cli
from reconcile.log import iso
from reconcile.sink import history
from reconcile.sink.compact import run_compact

UPDATES = st.lists(
    st.tuples(
        st.integers(1, 3),  # k
        st.sampled_from(["a", "b", None]),  # v
        st.sampled_from([None, None, None, "bad"]),  # _error
        st.integers(0, 12),  # _time
        st.sampled_from([-2, -1, 1, 1, 2]),  # _diff
    ),
    max_size=25,
)


def _duckdb_table(updates) -> str:
    values = ", ".join(
        "({}, {}, {}, {}, {})".format(k, "NULL" if v is None else f"'{v}'", "NULL" if e is None else f"'{e}'", t, d)
        for k, v, e, t, d in updates
    )
    create = 'CREATE TABLE log (k BIGINT, v VARCHAR, "_error" VARCHAR, "_time" BIGINT, "_diff" BIGINT)'
    return create + (f"; INSERT INTO log VALUES {values}" if updates else "")


def _log_state(updates, errors: bool) -> Callable[[int], Counter]:
    def state(t: int) -> Counter:
        out: Counter = Counter()
        for k, v, e, time, d in updates:
            if time <= t and (e is not None) == errors:
                out[(k, v, e) if errors else (k, v)] += d
        return Counter({r: n for r, n in out.items() if n})

    return state


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(updates=UPDATES)
def test_the_view_sql_on_random_update_logs(tmp_path, updates):
    """Distinct-row versions (ok rows, error rows) and upsert per-key versions, by DuckDB over
    random update logs (negative counts, several updates per time, cancelling updates)."""
    from upsert_model import upsert_sink

    query, upsert = make_sink(tmp_path, "hv"), upsert_sink(tmp_path, name="hw")
    setup = _duckdb_table(updates)
    for errors in (False, True):
        got = duckdb_rows(history.history_sql(query, '"log"', "duckdb", errors=errors), setup, delta=False)
        assert got == model_versions(_log_state(updates, errors), 0, 13)
    got = duckdb_rows(history.history_sql(upsert, '"log"', "duckdb"), setup, delta=False)
    assert got == numbered_per_key(model_versions(_log_state(updates, False), 0, 13))
    for t1, t2 in ((0, 12), (3, 7)):
        got = duckdb_rows(history.diff_sql(query, '"log"', t1, t2, "duckdb"), setup, delta=False)
        want = Counter({(*r, None): n for r, n in model_diff(_log_state(updates, False), t1, t2).items()})
        want.update(model_diff(_log_state(updates, True), t1, t2))
        assert Counter({r[:-1]: r[-1] for r in got}) == want


# -- real shards: Spark and DuckDB against the model ---------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2])
def test_query_sink_history_and_diff(spark, warehouse, tmp_path, sqlite_ledger, seed):
    rng, batches = random.Random(seed), 3
    cfg, ok, err = query_shard(spark, sqlite_ledger, tmp_path, rng, batches=batches)
    upper = AS_OF + 100 * batches
    want = model_versions(ok, AS_OF, upper)
    assert same_history_everywhere(spark, cfg) == want
    assert any(v[-1] is not None for v in want) and any(v[-1] is None for v in want)  # ended and current
    errors = same_history_everywhere(spark, cfg, errors=True)
    assert Counter({("ERR", *v[-3:]): n for v, n in errors.items()}) == model_versions(err, AS_OF, upper)
    check_diffs(spark, cfg, rng, ok, AS_OF, upper)
    # versions valid as of a time are the collection then
    t = rng.randrange(AS_OF, upper)
    assert Counter({v[:2]: v[2] for v in spark_history(spark, cfg, as_of=t)}) == ok(t)

    # compaction: exact from since on; what ended before since is gone
    since = AS_OF + 100 * rng.randint(1, batches - 1) + rng.choice([-1, 0, 17])
    run_compact(spark, sqlite_ledger, cfg, since=since, vacuum_files=False)
    assert same_history_everywhere(spark, cfg) == model_versions(ok, since, upper)
    check_diffs(spark, cfg, rng, ok, since, upper, pairs=1)


def test_changelog_sink_history_and_diff(spark, warehouse, tmp_path, sqlite_ledger):
    rng = random.Random(7)
    cfg, ok = changelog_shard(spark, sqlite_ledger, tmp_path, rng, batches=3)
    upper = AS_OF + 300
    want = model_versions(ok, AS_OF, upper)
    assert same_history_everywhere(spark, cfg) == want
    assert any(v[2] != 1 for v in want)  # multiplicities (and negative counts) are versions too
    check_diffs(spark, cfg, rng, ok, AS_OF, upper)
    run_compact(spark, sqlite_ledger, cfg, since=AS_OF + 150, vacuum_files=False)
    assert same_history_everywhere(spark, cfg) == model_versions(ok, AS_OF + 150, upper)


# -- the CLI -------------------------------------------------------------------------------------------


def _versions_of(report: dict, names: list[str]) -> Counter:
    return Counter(
        tuple(v[c] for c in names) + (v["count"], v["valid_from"]["ms"], (v["valid_to"] or {}).get("ms"))
        for v in report["versions"]
    )


@pytest.mark.slow  # the quick tier keeps this module's lighter tests
def test_upsert_sink_history_per_key_diff_and_cli(spark, warehouse, tmp_path, sqlite_ledger, monkeypatch, capsys):
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    rng = random.Random(3)
    cfg, ok = upsert_shard(spark, sqlite_ledger, tmp_path, rng, batches=4)
    upper = AS_OF + 400
    want = numbered_per_key(model_versions(ok, AS_OF, upper))
    assert same_history_everywhere(spark, cfg) == want
    assert all(v[3] == 1 for v in want)  # one value per key, count 1
    ends = {(v[0], v[5]) for v in want if v[5] is not None}
    assert ends - {(v[0], v[4]) for v in want}, "a delete ends a key's version with no successor"
    assert max(v[2] for v in want) >= 3  # keys with several versions
    check_diffs(spark, cfg, rng, ok, AS_OF, upper, pairs=2)
    capsys.readouterr()

    assert cli.main(["history", cfg.name, "--json", "--limit", "1000"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["per"] == "key" and report["note"] is None and not report["truncated"]
    assert _versions_of(report, ["k", "v", "version"]) == Counter(
        {(k, v, n, c, f, t): m for (k, v, n, c, f, t), m in want.items()}
    )

    assert cli.main(["history", cfg.name, "--key", "1"]) == 0  # text: ISO times with ms, "current"
    out = capsys.readouterr().out
    mine = [v for v in want if v[0] == 1]
    for v in mine:
        assert iso(v[4]) in out and (iso(v[5]) in out if v[5] is not None else "current" in out)
    assert len([line for line in out.splitlines() if line.startswith("  1 ")]) == len(mine)

    t = rng.randrange(AS_OF, upper)  # --as-of, as an ISO timestamp
    stamp = iso(t).split(" ")[0]
    assert cli.main(["history", cfg.name, "--as-of", stamp, "--json"]) == 0
    valid = json.loads(capsys.readouterr().out)["versions"]
    assert Counter({(v["k"], v["v"]): v["count"] for v in valid}) == ok(t)

    # the printed view, run by DuckDB and by Spark
    assert cli.main(["history", cfg.name, "--sql", "--dialect", "duckdb"]) == 0
    view = capsys.readouterr().out
    assert duckdb_rows(f'SELECT * FROM "{cfg.name}_history"', setup=view) == want
    assert cli.main(["history", cfg.name, "--sql"]) == 0
    spark.sql(capsys.readouterr().out.strip().rstrip(";"))
    assert Counter(tuple(r) for r in spark.sql(f"SELECT * FROM `{cfg.name}_history`").collect()) == want
    assert cli.main(["history", cfg.name, "--sql", "--dialect", "trino"]) == 0
    assert "register_table" in capsys.readouterr().out

    t1, t2 = sorted(rng.sample(range(AS_OF, upper), 2))
    assert cli.main(["diff", cfg.name, "--from", str(t1), "--to", iso(t2).split(" ")[0], "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    got = Counter({(c["k"], c["v"]): c["diff"] for c in report["changes"]})
    assert got == model_diff(ok, t1, t2)
    assert report["added"]["rows"] == sum(1 for n in got.values() if n > 0)
    assert cli.main(["diff", cfg.name, "--from", str(AS_OF), "--to", str(upper - 1)]) == 0
    out = capsys.readouterr().out
    assert iso(AS_OF) in out and iso(upper - 1) in out and "added" in out

    # out of range: one line naming the valid range, exit 2, no Spark work
    valid = f"{iso(0)} <= FROM < TO <= {iso(upper - 1)}"
    for bad in ([str(upper - 50), str(upper)], [str(200), str(150)], [str(200), str(200)]):
        assert cli.main(["diff", cfg.name, "--from", bad[0], "--to", bad[1]]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and valid in err, err
    assert cli.main(["diff", cfg.name, "--from", "yesterday", "--to", "5"]) == 2
    assert "neither epoch milliseconds nor an ISO-8601" in capsys.readouterr().err
    assert cli.main(["history", "no_such_sink"]) == 2

    # after compaction: exact from since on, a note; times before since refused in one line
    since = AS_OF + 150 + rng.randint(0, 200)
    run_compact(spark, sqlite_ledger, cfg, since=since, vacuum_files=False)
    assert same_history_everywhere(spark, cfg) == numbered_per_key(model_versions(ok, since, upper))
    capsys.readouterr()
    assert cli.main(["history", cfg.name]) == 0
    out = capsys.readouterr().out
    assert f"note: history before since {iso(since)} was compacted" in out
    assert cli.main(["history", cfg.name, "--as-of", str(since - 1)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "before since" in err and iso(since) in err, err
    assert cli.main(["diff", cfg.name, "--from", str(since - 1), "--to", str(since + 10)]) == 2
    assert f"{iso(since)} <= FROM < TO <= {iso(upper - 1)}" in capsys.readouterr().err
    assert cli.main(["diff", cfg.name, "--from", str(since), "--to", str(upper - 1), "--json"]) == 0
    got = Counter({(c["k"], c["v"]): c["diff"] for c in json.loads(capsys.readouterr().out)["changes"]})
    assert got == model_diff(ok, since, upper - 1)


def test_cli_errors_history_and_diff_of_a_query_sink(spark, warehouse, tmp_path, sqlite_ledger, monkeypatch, capsys):
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = make_sink(tmp_path, "he")
    for i, rows in enumerate(([{"k": 1, "v": "a"}, {"k": None, "v": "x"}], [{"k": 1, "v": "a"}, {"k": 1, "v": "a"}])):
        write_json_rows(tmp_path / "src", rows)
        run_stages(spark, sqlite_ledger, cfg, f"run-{i}", 200 + 100 * i)
    capsys.readouterr()
    assert cli.main(["history", cfg.name, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert _versions_of(report, ["k", "v"]) == Counter({(1, "a", 1, 199, 299): 1, (1, "a", 2, 299, None): 1})
    assert cli.main(["history", cfg.name, "--key", "v=a", "--key", "k=2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["versions"] == []
    assert cli.main(["history", cfg.name, "--key", "1"]) == 2  # no single upsert key: COLUMN=VALUE
    assert "expected COLUMN=VALUE" in capsys.readouterr().err
    assert cli.main(["history", cfg.name, "--errors", "--json"]) == 0
    (only,) = json.loads(capsys.readouterr().out)["versions"]
    assert "column 'k'" in only["_error"] and (only["count"], only["valid_to"]["ms"]) == (1, 299)
    assert cli.main(["diff", cfg.name, "--from", "199", "--to", "299"]) == 0
    out = capsys.readouterr().out
    assert "1 row(s) added (count 1), 0 removed" in out and "1 error row(s) changed" in out
    assert cli.main(["diff", cfg.name, "--from", "199", "--to", "299", "--errors", "--json"]) == 0
    (change,) = json.loads(capsys.readouterr().out)["changes"]
    assert change["diff"] == -1 and "column 'k'" in change["_error"]


def test_columns_named_like_the_views_own_and_sql_keywords(spark, tmp_path):
    """A sink with columns ``order``, ``count`` and ``valid_to``: quoted, and the view's own
    columns step aside (``_count``, ``_valid_to``); Spark and DuckDB agree with the model."""
    schema = [{"name": n, "type": t} for n, t in (("order", "bigint"), ("count", "string"), ("valid_to", "bigint"))]
    cfg = make_sink(tmp_path, "hk", schema=schema)
    names = history.output_names(cfg)
    assert (names["count"], names["valid_from"], names["valid_to"]) == ("_count", "valid_from", "_valid_to")
    updates = [
        (1, "x", 5, None, 10, 1),
        (1, "x", 5, None, 20, 1),
        (2, None, None, None, 20, 1),
        (1, "x", 5, None, 30, -2),
    ]
    want = Counter({(1, "x", 5, 1, 10, 20): 1, (1, "x", 5, 2, 20, 30): 1, (2, None, None, 1, 20, None): 1})
    ddl = "`order` BIGINT, `count` STRING, `valid_to` BIGINT, `_error` STRING, `_time` BIGINT, `_diff` BIGINT"
    spark.createDataFrame(updates, ddl).createOrReplaceTempView("hk_log")
    assert Counter(tuple(r) for r in spark.sql(history.history_sql(cfg, "hk_log", "spark")).collect()) == want
    rows = ", ".join(str(tuple("NULL" if x is None else x for x in u)).replace("'NULL'", "NULL") for u in updates)
    setup = (
        'CREATE TABLE log ("order" BIGINT, "count" VARCHAR, "valid_to" BIGINT, "_error" VARCHAR, "_time" BIGINT, '
        f'"_diff" BIGINT); INSERT INTO log VALUES {rows}'
    )
    assert duckdb_rows(history.history_sql(cfg, "log", "duckdb"), setup, delta=False) == want
