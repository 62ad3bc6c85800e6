"""The sink's tables by name through a real Hive metastore service (``RECONCILE_METASTORE=
thrift://...``): Hive's standalone metastore server (harness/metastore_server.py), a batch that
registers its tables there, and consumers in other processes that know nothing of the sink's
files reading them by name (the expected rows from a plain-Python model)."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from current_readers import readers_saw, rows_of, start_readers, start_run
from harness.metastore_server import JavaMissing, java, metastore_service
from helpers import make_sink, model_kv

BATCHES = [
    [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"k": 2, "v": "b"}, {"k": 3, "v": None}, {"k": 4, "v": "é ü"}],
    [{"k": 1, "v": "A"}, {"k": 2, "v": "b"}, {"k": 4, "v": "é ü"}, {"k": 4, "v": "é ü"}, {"k": 5, "v": "e"}],
]

# A second analyst: reconcile.spark.consumer_session() in a process of its own, reading by name
# in a loop until told to stop, then a model over the table.
ANALYST = """
import json, pathlib, sys, time
from reconcile.spark import consumer_session
spark = consumer_session("analyst")
stop, ready = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
seen = []
while True:
    done = stop.exists()
    rows = spark.sql("SELECT k, v FROM marts.orders").collect()
    seen.append({"at": time.time(), "rows": sorted(([r.k, r.v] for r in rows), key=json.dumps)})
    ready.touch()
    if done:
        break
    time.sleep(0.5)
by_v = spark.sql("SELECT v, count(*) AS n FROM marts.orders GROUP BY v").collect()
out = {
    "seen": seen,
    "model": sorted(([r.v, r.n] for r in by_v), key=json.dumps),
    "tables": sorted(t.name for t in spark.catalog.listTables("marts") if not t.isTemporary),
    "catalog": spark.conf.get("spark.sql.catalogImplementation"),
}
print("RESULT " + json.dumps(out))
"""


def need_java() -> None:
    """Skip without Java, except under CI (CI=true), where the test must run."""
    try:
        java()
    except JavaMissing as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"the metastore-service test cannot run on CI: {exc}")
        pytest.skip(str(exc))


@pytest.mark.slow  # a metastore server, two runs and two readers: five JVMs
def test_consumers_read_by_name_from_a_metastore_service(tmp_path):
    """``reconcile run`` registers ``marts.orders`` and ``marts.orders_log`` in a real metastore
    service. While a second run writes its batch, two consumers in processes of their own, with
    no sink files and a home of their own (the names can come only from the service), read the
    current table by name at once: ``python -m reconcile sql`` and
    ``reconcile.spark.consumer_session()``; each sees the state before or after the batch, never
    a half-applied one, and the batch's rows once it is done."""
    need_java()
    with metastore_service(tmp_path / "metastore") as uri:
        env = {
            **os.environ,
            "RECONCILE_HOME": str(tmp_path / "home"),
            "RECONCILE_WAREHOUSE": str(tmp_path / "warehouse"),
            "RECONCILE_METADATA_URL": f"sqlite:///{tmp_path / 'ledger.db'}",
            "RECONCILE_SINKS_DIR": str(tmp_path / "sinks"),
            "RECONCILE_METASTORE": uri,
        }
        env.pop("PYSPARK_GATEWAY_PORT", None)
        env.pop("RECONCILE_SPARK_REMOTE", None)
        (tmp_path / "sinks").mkdir()
        src = {"sources": {"src": {"format": "json", "path": str(tmp_path / "src")}}, "sql": "SELECT k, v FROM src"}
        make_sink(tmp_path / "sinks", "orders", current={"database": "marts"}, query=src)

        def run(frontier: int, rows: list[dict]) -> subprocess.Popen:
            return start_run(env, "orders", frontier, tmp_path / "src", rows)

        first = run(200, BATCHES[0])
        out, err = first.communicate(timeout=600)
        assert first.returncode == 0, out[-2000:] + err[-2000:]
        marker = tmp_path / "home" / "catalog" / "orders.json"  # what the run registered, and where
        assert marker.exists() and "could not register" not in out + err, out + err[-3000:]
        assert json.loads(marker.read_text())["metastore"] == uri
        before, after = rows_of(model_kv(BATCHES[0])), rows_of(model_kv(BATCHES[1]))

        # the consumers: no sink files, a home of their own; only the service knows the names
        (tmp_path / "nothing").mkdir()
        reader_env = {
            **env,
            "RECONCILE_SINKS_DIR": str(tmp_path / "nothing"),
            "RECONCILE_HOME": str(tmp_path / "reader"),
        }
        stop, ready = tmp_path / "stop", tmp_path / "ready"
        query = "SELECT k, v FROM marts.orders ORDER BY k, v"
        readers = start_readers(reader_env, tmp_path, query, ANALYST, str(stop), str(ready))
        analyst = readers[1]
        deadline = time.monotonic() + 600
        while not ready.exists():  # the analyst reads: now the second batch runs
            assert analyst.poll() is None and time.monotonic() < deadline, analyst.communicate()[1][-3000:]
            time.sleep(0.2)
        started = time.time()
        second = run(300, BATCHES[1])
        _, ended, got = readers_saw(second, readers, stop, before, after)

    assert got["catalog"] == "hive" and got["tables"] == ["orders", "orders_log"]
    assert any(started < s["at"] < ended for s in got["seen"]), "the analyst read while the batch ran"
    assert not (tmp_path / "reader" / "metastore_db").exists()  # no Derby of the readers' own
