"""Deletion vectors as the sink writes and reads them (``reconcile.storage.deletion_vectors``),
checked against delta-rs's decoding (its kernel's) and DuckDB's reads of a table carrying them,
and against a vector Spark wrote (run containers)."""

from __future__ import annotations

import json
import time

import numpy as np
import pyarrow as pa
import pytest

from reconcile.storage import deletion_vectors as dv
from reconcile.storage import files


def delta_rs_deleted(path: str) -> dict[str, np.ndarray]:
    """Each data file's deleted positions as delta-rs decodes them (its selection vectors)."""
    from deltalake import DeltaTable

    out = {}
    vectors = pa.table(DeltaTable(path).deletion_vectors().read_all())
    for uri, keep in zip(
        vectors.column("filepath").to_pylist(), vectors.column("selection_vector").to_pylist(), strict=True
    ):
        out[uri.rsplit("/", 1)[-1]] = np.flatnonzero(~np.asarray(keep, dtype=bool))
    return out


SHAPES = {
    "empty-ish": np.array([0]),
    "sparse": np.array([3, 4, 7, 11, 18, 29]),
    "dense container": np.arange(0, 60_000, 3),  # > 4096 in one 2^16 range: a bitset
    "many containers": np.arange(5, 600_000, 997),
    "edges": np.array([0, 65_535, 65_536, 131_071, 199_999]),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_encode_then_decode_is_the_identity(shape):
    positions = SHAPES[shape]
    assert np.array_equal(dv.decode(dv.encode(positions)), np.unique(positions))


def test_z85_round_trip():
    raw = bytes(range(16))
    assert dv.unz85(dv.z85(raw)) == raw
    assert dv.z85(bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])) == "HelloWorld"  # ZeroMQ's example


def test_delta_rs_and_duckdb_read_the_sinks_vectors(tmp_path):
    """One file of 700,000 rows; the sink's vector file holds a vector for it (all shapes'
    positions at once); committed by hand as the current table commits: delta-rs decodes the same
    positions, and its scan and DuckDB's return exactly the other rows."""
    from deltalake import DeltaTable, write_deltalake

    path = str(tmp_path / "t")
    schema = pa.schema([("k", pa.int64())])
    DeltaTable.create(path, schema=schema, configuration={"delta.enableDeletionVectors": "true"})
    write_deltalake(path, pa.table({"k": pa.array(range(700_000), pa.int64())}), mode="append")
    add = next(a["add"] for a in map(json.loads, open(f"{path}/_delta_log/{1:020d}.json")) if "add" in a)
    positions = np.unique(np.concatenate(list(SHAPES.values())))
    descriptor = dv.write_file(path, {add["path"]: positions})[add["path"]]
    assert descriptor["cardinality"] == len(positions)
    now = int(time.time() * 1000)
    actions = [
        {"remove": {"path": add["path"], "deletionTimestamp": now, "dataChange": True, "size": add["size"]}},
        {"add": {**add, "modificationTime": now, "deletionVector": descriptor}},
    ]
    body = "".join(json.dumps(a) + "\n" for a in actions).encode()
    assert files.put_if_absent(f"{path}/_delta_log/{2:020d}.json", body)
    assert not files.put_if_absent(f"{path}/_delta_log/{2:020d}.json", body), "put-if-absent refuses a taken version"
    assert np.array_equal(delta_rs_deleted(path)[add["path"]], positions)
    assert np.array_equal(dv.read(path, {add["path"]: descriptor})[add["path"]], positions)
    want = sorted(set(range(700_000)) - set(positions.tolist()))
    got = pa.RecordBatchReader.from_stream(DeltaTable(path).scan()).read_all().column("k").to_pylist()
    assert sorted(got) == want
    import duckdb
    from duckdb_extensions import import_extension

    con = duckdb.connect()
    import_extension("delta", con=con)
    con.sql("LOAD delta")
    assert con.sql(f"SELECT count(*), sum(k) FROM delta_scan('{path}')").fetchone() == (len(want), sum(want))


def test_a_vector_spark_wrote_is_read_alike(spark, tmp_path):
    """Spark's DELETE of a range (a run container) and of scattered rows: the sink's decoding of
    its vectors equals delta-rs's."""
    path = str(tmp_path / "s")
    spark.range(0, 100_000, 1, 1).selectExpr("id AS k").write.format("delta").save(path)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE k BETWEEN 100 AND 20000 OR k % 997 = 5")
    versions = sorted(n for n in files.list_names(f"{path}/_delta_log") if n.endswith(".json"))
    adds = [a["add"] for a in map(json.loads, open(f"{path}/_delta_log/{versions[-1]}")) if "add" in a]
    descriptors = {a["path"]: a["deletionVector"] for a in adds if a.get("deletionVector")}
    assert descriptors, "Spark wrote a deletion vector"
    ours = dv.read(path, descriptors)
    theirs = delta_rs_deleted(path)
    assert {p: list(v) for p, v in ours.items()} == {p: list(theirs[p]) for p in ours}
    assert sum(len(v) for v in ours.values()) == 19_901 + sum(
        1 for k in range(100_000) if k % 997 == 5 and not 100 <= k <= 20000
    )
