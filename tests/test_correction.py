"""The correction ``desired - persist`` against an independent plain-Python model (Counters).

Updates are tuples ``(*row, _error, _time, _diff)``; results are multisets
``{(*row, _error, _time): diff}``.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from helpers import make_sink, write_json_rows
from reconcile.config_loading import parse
from reconcile.differential import as_of, partition_of
from reconcile.kinds import changelog, desired, query


def correction(cfg, desired_frame, persist, lower, upper):
    """The kind's own correction (query: a snapshot at upper - 1; changelog: advanced times)."""
    kind = query if cfg.kind == "query" else changelog
    return kind.correction(cfg, desired_frame, persist, lower, upper)


def read_desired(spark, cfg):
    return desired(spark, cfg)


KV = [{"name": "k", "type": "bigint"}, {"name": "v", "type": "string"}]


def config(kind: str, schema=KV, partitions: int = 3):
    section = (
        {"query": {"sql": "SELECT * FROM src"}}
        if kind == "query"
        else {"changelog": {"source": {"format": "json", "path": "log"}, "time_column": "ts", "diff_column": "diff"}}
    )
    return parse(
        {
            "name": f"t_{kind}",
            "kind": kind,
            "schema": schema,
            "start_date": "1970-01-01",
            "partitions": partitions,
            **section,
        },
        "test.yaml",
    )


CHANGELOG, QUERY = config("changelog"), config("query")


def frame(spark, updates, cfg=CHANGELOG):
    """An update frame of cfg's columns from (*row, _error, _time, _diff) tuples."""
    ddl = ", ".join(f"{c.name} {c.type}" for c in cfg.columns) + ", _error string, _time bigint, _diff bigint"
    return spark.createDataFrame(list(updates), ddl)


def run(spark, cfg, desired, persist, lower, upper) -> Counter:
    """correction() collected as a multiset; checks it is consolidated and _part in [0, P)."""
    result = Counter()
    for r in correction(cfg, frame(spark, desired, cfg), frame(spark, persist, cfg), lower, upper).collect():
        key = tuple(r[c] for c in cfg.column_names) + (r["_error"], r["_time"])
        assert key not in result, f"correction is not consolidated: {key} twice"
        assert 0 <= r["_part"] < cfg.partitions and r["_diff"] != 0
        result[key] = r["_diff"]
    return result


# --- the model --------------------------------------------------------------------------------


def consolidated(c: Counter) -> Counter:
    return Counter({key: n for key, n in c.items() if n != 0})


def model(kind, desired, persist, lower, upper) -> Counter:
    out: Counter = Counter()
    for *row, t, d in desired:
        if kind == "query":
            out[(*row, upper - 1)] += d
        elif t < upper:
            out[(*row, max(t, lower))] += d
    for *row, t, d in persist:
        if t < upper:  # everything the shard holds below upper (foreign updates in [lower, upper) too)
            out[(*row, upper - 1 if kind == "query" else max(t, lower))] -= d
    return consolidated(out)


def model_as_of(updates, t) -> Counter:
    out: Counter = Counter()
    for *row, time, d in updates:
        if time <= t:
            out[tuple(row)] += d
    return consolidated(out)


# --- hand-written cases (they also check the model) -------------------------------------------


def test_changelog_correction(spark):
    lower, upper = 10, 20
    desired = [
        (1, "a", None, 3, 1),
        (1, "a", None, 3, 1),  # the same row twice: diff 2 at lower
        (2, "b", None, 12, 2),  # inside [lower, upper): kept at its time
        (3, "c", None, 15, -1),  # a negative diff
        (4, "d", None, 5, 1),  # cancels persist exactly
        (5, "e", None, 20, 1),
        (6, "f", None, 25, 1),  # at/after upper: excluded
        (None, None, "bad row", 11, 1),  # an error row is corrected like data
        (None, None, "old error", 1, 1),  # an error already persisted: cancels
        (10, "j", None, 7, 1),
    ]
    persist = [
        (4, "d", None, 2, 1),
        (None, None, "old error", 0, 1),
        (2, "b", None, 3, 1),  # retracted at lower; desired stays at 12
        (7, "g", None, 9, 1),  # drift: retracted at lower
        (10, "j", None, 8, 3),  # duplicated in persist: -2 at lower
        (8, "h", None, 10, 1),
        (9, "i", None, 19, 5),
        (None, None, "new", 15, 1),  # foreign, in [lower, upper)
        (11, "k", None, 20, 1),  # at upper: left for a later batch
    ]
    expected = Counter(
        {
            (1, "a", None, 10): 2,
            (2, "b", None, 12): 2,
            (2, "b", None, 10): -1,
            (3, "c", None, 15): -1,
            (None, None, "bad row", 11): 1,
            (7, "g", None, 10): -1,
            (10, "j", None, 10): -2,
            (8, "h", None, 10): -1,
            (9, "i", None, 19): -5,
            (None, None, "new", 15): -1,  # repaired at their times
        }
    )
    assert model("changelog", desired, persist, lower, upper) == expected
    assert run(spark, CHANGELOG, desired, persist, lower, upper) == expected


def test_query_correction_stamped_at_upper_minus_one(spark):
    lower, upper = 10, 20
    desired = [  # a snapshot: its times are meaningless
        (1, "a", None, None, 1),
        (1, "a", None, None, 1),
        (2, "b", None, None, 1),
        (None, None, "e1", None, 1),
    ]
    persist = [
        (2, "b", None, 5, 1),  # as desired: cancels
        (3, "c", None, 9, 1),  # as of lower-1: retracted
        (4, "d", None, 10, 1),  # foreign, inside [lower, upper): retracted
        (6, "y", None, 20, 1),  # at upper: left for a later batch
        (None, None, "e2", 0, 1),  # a stale error: retracted
        (5, "x", None, 2, 1),
        (5, "x", None, 8, -1),  # inserted then deleted: absent
    ]
    expected = Counter(
        {
            (1, "a", None, 19): 2,
            (3, "c", None, 19): -1,
            (4, "d", None, 19): -1,
            (None, None, "e1", 19): 1,
            (None, None, "e2", 19): -1,
        }
    )
    assert model("query", desired, persist, lower, upper) == expected
    assert run(spark, QUERY, desired, persist, lower, upper) == expected


@pytest.mark.parametrize("cfg", [CHANGELOG, QUERY], ids=["changelog", "query"])
def test_empty_correction_when_desired_equals_persist(spark, cfg):
    log = [
        (1, "a", None, 3, 1),
        (2, "b", None, 5, 2),
        (None, None, "err", 0, 1),
        (3, "c", None, 1, 1),
        (3, "c", None, 4, -1),
    ]
    assert model(cfg.kind, log, log, 10, 20) == Counter()
    assert run(spark, cfg, log, log, 10, 20) == Counter()


def test_correction_rejects_empty_description(spark):
    with pytest.raises(AssertionError):
        correction(CHANGELOG, frame(spark, []), frame(spark, []), 5, 5)


# --- partitions -------------------------------------------------------------------------------


def test_identical_rows_share_a_partition(spark):
    rows = [(k, v, None) for k in range(40) for v in ("a", None)] + [(None, None, f"e{i}") for i in range(5)]
    desired = frame(spark, [r + (7, 1) for r in rows]).withColumn("_part", partition_of(CHANGELOG))
    # persist as the shard stores it: other times, other diffs, Delta's column order
    persist = (
        frame(spark, [r + (2, -3) for r in rows])
        .select("k", "v", "_time", "_diff", "_error")
        .withColumn("_part", partition_of(CHANGELOG))
    )
    d = {(r.k, r.v, r._error): r._part for r in desired.collect()}
    p = {(r.k, r.v, r._error): r._part for r in persist.collect()}
    assert d == p and len(d) == len(rows)
    assert set(d.values()) == {0, 1, 2}  # rows are spread over all P partitions
    wide = {r._part for r in desired.select(partition_of(CHANGELOG, 7).alias("_part")).collect()}
    assert wide <= set(range(7)) and len(wide) > 3

    # in a correction, one row at two times lands in one partition
    desired, persist = frame(spark, [r + (12, 1) for r in rows]), frame(spark, [r + (3, 1) for r in rows])
    out = correction(CHANGELOG, desired, persist, 10, 20)
    parts: dict[tuple, set[int]] = {}
    collected = out.collect()
    for r in collected:
        parts.setdefault((r.k, r.v, r._error), set()).add(r._part)
    assert len(collected) == 2 * len(rows)  # +1 at time 12, -1 at lower
    assert {row: ps.pop() for row, ps in parts.items() if len(ps) == 1} == d


# --- randomized -------------------------------------------------------------------------------


def random_updates(rng: random.Random, n: int, case: int, times=True):
    out = []
    for _ in range(n):
        if rng.random() < 0.15:
            row = (case, None, None, rng.choice(["e1", "e2"]))
        else:
            row = (case, rng.randint(0, 3), rng.choice(["a", "b", None]), None)
        out.append(row + (rng.randint(0, 50) if times else None, rng.randint(-2, 3)))
    return out


CASED = [{"name": "c", "type": "bigint"}] + KV  # c keeps the cases of one correction call apart


def test_correction_matches_model_on_random_cases(spark):
    """30 random cases, 3 per random description (one Spark job per description)."""
    rng = random.Random(20240601)
    nonempty = 0
    for call in range(10):
        kind = rng.choice(["changelog", "query"])
        lower = rng.randint(0, 49)
        upper = rng.randint(lower + 1, 51)
        cases = []
        for case in range(3):
            desired = random_updates(rng, rng.randint(0, 12), case, times=kind == "changelog")
            # persist often repeats desired rows so that some updates cancel
            persist = random_updates(rng, rng.randint(0, 6), case) + [
                (*row, rng.randint(0, 50) if t is None else t, d) for *row, t, d in desired if rng.random() < 0.5
            ]
            cases.append((desired, persist))
        all_desired, all_persist = [u for d, _ in cases for u in d], [u for _, p in cases for u in p]
        got = run(spark, config(kind, CASED), all_desired, all_persist, lower, upper)
        for case, (desired, persist) in enumerate(cases):
            mine = Counter({key: n for key, n in got.items() if key[0] == case})
            assert mine == model(kind, desired, persist, lower, upper), (
                f"call {call} case {case}: {kind} [{lower}, {upper}) desired={desired} persist={persist}"
            )
            nonempty += bool(mine)
        assert {key[0] for key in got} <= {0, 1, 2}
    assert nonempty >= 20  # the generator does not produce trivially empty cases


# --- as_of ------------------------------------------------------------------------------------


def test_as_of_matches_model(spark):
    small = [(1, "a", None, 5, 2), (1, "a", None, 9, -2), (2, "b", None, 9, 1), (None, None, "e1", 0, 1)]
    assert model_as_of(small, 5) == Counter({(1, "a", None): 2, (None, None, "e1"): 1})
    assert model_as_of(small, 9) == Counter({(2, "b", None): 1, (None, None, "e1"): 1})
    log = [u[1:] for u in random_updates(random.Random(7), 60, case=0)] + small
    df = frame(spark, log)
    for t in (-1, 5, 9, 50):
        got = Counter({(r.k, r.v, r._error): r._diff for r in as_of(CHANGELOG, df, t).collect()})
        assert got == model_as_of(log, t), f"as of {t}"


# --- validation of a changelog source (read_desired) ------------------------------------------


def desired_rows(spark, tmp_path, rows):
    cfg = make_sink(tmp_path, "cl", kind="changelog")
    write_json_rows(tmp_path / "log", rows)
    return cfg, read_desired(spark, cfg).collect()


def test_changelog_source_invalid_rows_become_errors(spark, tmp_path):
    cfg, out = desired_rows(
        spark,
        tmp_path,
        [
            {"k": 1, "v": "a", "ts": 5, "diff": 2},
            {"k": "abc", "v": "b", "ts": 6, "diff": 1},  # not a bigint
            {"k": None, "v": "c", "ts": 7, "diff": 1},  # null in a non-nullable column
            {"k": 4, "v": "d", "ts": 8, "diff": 0},  # zero diff
            {"k": 5, "v": "e", "ts": 9, "diff": None},  # null diff
            {"k": 6, "v": "f", "ts": None, "diff": 1},  # null time
            {"k": 7, "v": None, "ts": 10, "diff": -3},
            {"k": "8", "v": "h", "ts": 11, "diff": 1},  # a string that is a bigint
        ],
    )
    assert len(out) == 8  # nothing dropped
    ok = Counter({(r.k, r.v, r._time): r._diff for r in out if r._error is None})
    assert ok == Counter({(1, "a", 5): 2, (7, None, 10): -3, (8, "h", 11): 1})
    errors = [r for r in out if r._error is not None]
    assert all(r.k is None and r.v is None and r._diff == 1 for r in errors)
    named = sorted((r._time, next(w for w in ("'k'", "'diff'", "'ts'") if w in r._error)) for r in errors)
    assert named == [(0, "'ts'"), (6, "'k'"), (7, "'k'"), (8, "'diff'"), (9, "'diff'")]
    assert any('"abc"' in r._error for r in errors)  # the raw value is kept in the message


def test_changelog_source_fractional_numbers_are_errors(spark, tmp_path):
    _, out = desired_rows(
        spark,
        tmp_path,
        [
            {"k": 1, "v": "a", "ts": 5, "diff": 1.5},  # non-integer diff
            {"k": 2, "v": "b", "ts": 6.5, "diff": 1},  # non-integer time
            {"k": 2.7, "v": "c", "ts": 7, "diff": 1},  # k does not fit bigint
        ],
    )
    assert sorted(r._error is not None for r in out) == [True, True, True], out


def _cells_model(rows: dict[tuple[int, int], int], per_table: int) -> dict[int, tuple]:
    """Cells as plain Python sums them: each key, times its count, into one cell of each table."""
    from reconcile.differential_cells import cells_of, check_hash

    out: dict[int, list[int]] = {}
    for (k1, k2), n in rows.items():
        h = check_hash(k1, k2)
        for c in cells_of(k2, per_table):
            sums = out.setdefault(c, [0] * 7)
            for i, x in enumerate((1, k1 & 0xFFFFFFFF, k1 >> 32, k2 & 0xFFFFFFFF, k2 >> 32, h & 0xFFFFFFFF, h >> 32)):
                sums[i] += n * x
    return {c: tuple(v) for c, v in out.items()}


def test_the_cells_check_hash_is_sparks(spark):
    """The check hash a pure cell's key must match, computed in Python, is Spark's xxhash64 of the
    key's two halves."""
    from pyspark.sql import functions as F

    from reconcile.differential_cells import check_hash

    rng = random.Random(7)
    keys = [(0, 0), (-1, 1), (-(1 << 63), (1 << 63) - 1)] + [
        (rng.randrange(-(1 << 63), 1 << 63), rng.randrange(-(1 << 63), 1 << 63)) for _ in range(50)
    ]
    df = spark.createDataFrame(keys, "a BIGINT, b BIGINT").select("a", "b", F.xxhash64("a", "b").alias("h"))
    assert {(r.a, r.b): r.h for r in df.collect()} == {k: check_hash(*k) for k in keys}


@pytest.mark.parametrize("changed", [0, 1, 40, 300])
def test_cells_peel_exactly_the_keys_whose_count_changed(changed):
    """Peeling the difference of two sides' cells gives every key whose count differs, with the
    difference (a key only one side holds, a count that grew or shrank), and nothing else; far
    more changed keys than cells do not peel (NotPeeled), they are never guessed."""
    from reconcile.differential_cells import NotPeeled, peel

    rng = random.Random(changed)
    key = lambda: (rng.randrange(-(1 << 63), 1 << 63), rng.randrange(-(1 << 63), 1 << 63))  # noqa: E731
    persist = {key(): rng.choice([1, 1, 1, 2, 5]) for _ in range(2000)}
    desired = dict(persist)
    for k in rng.sample(sorted(persist), changed // 2):
        desired[k] = rng.choice([0, 0, 2, 3]) if desired[k] == 1 else desired[k] - 1  # deleted, or count changed
    while len({k for k in desired.keys() | persist.keys() if desired.get(k, 0) != persist.get(k, 0)}) < changed:
        desired[key()] = rng.choice([1, 2])  # new keys
    want = sorted(
        (k1, k2, desired.get((k1, k2), 0) - persist.get((k1, k2), 0)) for k1, k2 in desired.keys() | persist.keys()
    )
    want = [w for w in want if w[2]]
    assert len(want) == changed
    assert sorted(peel(_cells_model(desired, 256), _cells_model(persist, 256), 256)) == want
    if changed >= 40:
        with pytest.raises(NotPeeled):
            peel(_cells_model(desired, 8), _cells_model(persist, 8), 8)


@pytest.mark.parametrize(
    ("way", "bits"),
    [("one_scan", 64), ("one_scan", 2), ("one_scan_fallback", 64), ("hash_first", 64), ("hash_first", 2)],
)
def test_key_first_batches_match_the_model_even_when_keys_collide(
    way, bits, spark, warehouse, tmp_path, sqlite_ledger, monkeypatch, caplog
):
    """A query sink's batches compare 128-bit row keys first: in one scan of the query's result
    (its keys summed into cells, peeled) or in two passes (hash first), shuffling only the changed
    rows in full. With the key narrowed to 2 bits a half (a test build: nearly every pair of rows
    collides), a collision can hide a change; the batch's checksums over the full row hash catch
    it, and the batch is computed again comparing every row: the shard still equals the model
    after every batch. With the full key no batch needs that. With too few cells to peel the
    change, the batch is computed with more cells, then hash first, and is as exact."""
    import logging

    from helpers import run_stages, shard_as_of
    from reconcile.differential import KEY_BITS_ENV
    from reconcile.differential_cells import CELLS_ENV, ENV

    monkeypatch.setenv(KEY_BITS_ENV, str(bits))
    monkeypatch.setenv("RECONCILE_HASH_FIRST_MIN_ROWS", "1")  # key first on a shard of a few rows
    monkeypatch.setenv(ENV, "0" if way == "hash_first" else "1")
    if way == "one_scan_fallback":
        monkeypatch.setenv(CELLS_ENV, "1")  # 3 cells, then 24: a change of ~10 keys does not peel in 3
    cfg = make_sink(tmp_path, f"{way}_{bits}")
    rng = random.Random(bits)
    rows = [{"k": rng.randrange(30), "v": rng.choice("abc")} for _ in range(40)]
    again = passes = scans = unpeeled = 0
    for i in range(5):
        write_json_rows(tmp_path / "src", rows)
        with caplog.at_level(logging.INFO, logger="reconcile"):
            caplog.clear()
            run_stages(spark, sqlite_ledger, cfg, f"r{i}", 200 + 100 * i)
        again += sum("comparing every row in full" in r.getMessage() for r in caplog.records)
        passes += sum(r.getMessage().startswith("hash-first pass 1: ") for r in caplog.records)
        scans += sum(r.getMessage().startswith("one scan: ") and "peeled" in r.getMessage() for r in caplog.records)
        unpeeled += sum("the cells did not peel" in r.getMessage() for r in caplog.records)
        assert shard_as_of(cfg, 199 + 100 * i) == Counter((r["k"], r["v"], None) for r in rows), f"batch {i}"
        rows = [r for r in rows if rng.random() < 0.8] + [
            {"k": rng.randrange(30), "v": rng.choice("abc")} for _ in range(rng.randrange(1, 8))
        ]
        if rows:  # a changed value of a kept row
            rows[0] = {**rows[0], "v": rows[0]["v"] + "x"}
    if way == "hash_first":
        assert passes >= 4 and scans == 0  # every batch after the first hashed first
    elif way == "one_scan" and bits == 64:
        assert scans >= 4 and passes == 0 and unpeeled == 0  # one scan each
    elif way == "one_scan_fallback":
        assert unpeeled >= 4 and scans + passes >= 4  # more cells (peeled), or then hash first
    if bits == 64:
        assert again == 0
    else:
        assert again >= 1  # collisions hid changes, and the checksums caught them
