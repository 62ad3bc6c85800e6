"""Shared fixtures: one local SparkSession per test session, fresh warehouse and metadata per test.

Metadata tests run on SQLite and on PostgreSQL (``RECONCILE_TEST_POSTGRES_URL``, e.g.
``postgresql+psycopg://postgres:postgres@127.0.0.1:5432/reconcile_test``); each PostgreSQL test
gets a schema of its own. Under CI (``CI=true``) a missing PostgreSQL is an error, not a skip.
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_SESSION_TMP = Path(tempfile.mkdtemp(prefix="reconcile-tests-"))
os.environ.setdefault("RECONCILE_HOME", str(_SESSION_TMP / "home"))
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# The suite's many Spark processes share no metastore (the embedded one serves one process at a
# time); tests/test_current.py turns the catalog on where it is the subject.
os.environ.setdefault("RECONCILE_METASTORE", "none")
# The embedded default sizes a driver for the machine (reconcile.spark): the suite's many
# short-lived JVMs stay at 2 GiB each (tests/test_spark_conf.py checks the sizing itself).
os.environ.setdefault("SPARK_DRIVER_MEMORY", "2g")
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))  # the servers tests and benchmarks share: harness/
# Airflow reads its configuration at import: point it at a private home before any import.
os.environ["AIRFLOW_HOME"] = str(_SESSION_TMP / "airflow")
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(ROOT / "dags")
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(ROOT / "plugins")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW_CONN_SPARK_DEFAULT"] = '{"conn_type": "spark", "host": "local[2]"}'
os.environ["RECONCILE_RETRY_DELAY_SECONDS"] = "1"
os.environ["PYTHONPATH"] = f"{ROOT / 'include'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"

# The JVMs the tests start as subprocesses (spark-submit jobs of the crash, race, Airflow and
# scheduler tests) live for seconds: C1 only and the serial collector start them faster
# (measured side by side: a job of 3 small Delta writes and reads 24.3 s -> 19.0 s; tests/test_crash.py,
# where half the work is in-process, 363 s -> 350 s). The long-lived in-process session keeps the
# JVM's defaults (C1 only made the in-process tests 1.5x slower: 267 s -> 395 s). Off when
# RECONCILE_TEST_SPARK=default or when JDK_JAVA_OPTIONS is already set.
SHORT_LIVED_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# The long-lived ones (this process's session, the Connect server) map Spark's classes too.
LONG_LIVED_JVM_OPTIONS = ""
if os.environ.get("RECONCILE_TEST_JVM_ARCHIVE"):  # Spark's classes mapped, not parsed: tests/jvm_archive.py
    LONG_LIVED_JVM_OPTIONS = f"-XX:SharedArchiveFile={os.environ['RECONCILE_TEST_JVM_ARCHIVE']} -Xlog:cds*=off"
    SHORT_LIVED_JVM_OPTIONS += " " + LONG_LIVED_JVM_OPTIONS
SPARK_MODE = os.environ.get("RECONCILE_TEST_SPARK", "tiny")
if SPARK_MODE == "tiny":
    os.environ.setdefault("JDK_JAVA_OPTIONS", SHORT_LIVED_JVM_OPTIONS)

PG_URL = os.environ.get("RECONCILE_TEST_POSTGRES_URL")
# py4j logs while the interpreter shuts down, after pytest closed its streams: keep it quiet.
import logging  # noqa: E402

logging.getLogger("py4j").setLevel(logging.ERROR)


# The in-process tests hold a few dozen rows per table: they run with TINY_DATA_CONF. The
# spark-submit jobs of the Airflow and crash tests keep the production settings, so those are
# covered too; RECONCILE_TEST_SPARK=default runs the in-process tests on them as well.
@pytest.fixture(scope="session")
def spark():
    from reconcile.spark import get_session
    from tiny_spark import TINY_DATA_CONF

    if SPARK_MODE not in ("tiny", "default"):
        pytest.exit(f"RECONCILE_TEST_SPARK={SPARK_MODE!r}: use 'tiny' (the default) or 'default'", returncode=4)
    conf = {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}
    if SPARK_MODE == "tiny":
        conf.update(TINY_DATA_CONF)
    short_lived = os.environ.get("JDK_JAVA_OPTIONS") == SHORT_LIVED_JVM_OPTIONS
    if short_lived:  # not for this JVM: it lives as long as the test session
        if LONG_LIVED_JVM_OPTIONS:
            os.environ["JDK_JAVA_OPTIONS"] = LONG_LIVED_JVM_OPTIONS
        else:
            del os.environ["JDK_JAVA_OPTIONS"]
    try:
        session = get_session("reconcile-tests", conf)
    finally:
        if short_lived:
            os.environ["JDK_JAVA_OPTIONS"] = SHORT_LIVED_JVM_OPTIONS
    yield session
    session.stop()


def _shared_dir(config) -> Path | None:
    """The directory every xdist worker of this run shares (None without xdist)."""
    base = config._tmp_path_factory.getbasetemp()
    if hasattr(config, "workerinput"):
        return base.parent
    return base if config.pluginmanager.hasplugin("dsession") else None


@pytest.fixture(scope="session")
def connect_url(request, tmp_path_factory):
    """A Spark Connect server (its own JVM, local[2], the Delta jars and the sink's conf): the URL
    its clients use. Started by the sink's own command (reconcile.connect_server), once per test
    run: the first xdist worker that asks starts it, the others use it, and the run's controller
    stops it at the end. pyspark is classic or Connect per process: its clients run in
    subprocesses (or Airflow's task processes), while this process reads with ``spark``."""
    import fcntl

    shared = _shared_dir(request.config)
    home = (shared or tmp_path_factory.getbasetemp()) / "connect-home"
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one worker starts it; the others wait for its URL
        record = home / "url"
        if record.exists():
            url = record.read_text()
        else:
            url = start_connect_server(home)  # test_connect warms it
            record.write_text(url)
    yield url
    if shared is None:
        _stop_connect(home)


def start_connect_server(home: Path, environment: dict[str, str] | None = None) -> str:
    """A Spark Connect server on a free port (local[2], the tests' tiny-data conf, a long-lived
    JVM's options; ``environment`` added to this process's): its URL; its port in ``home/port``
    for :func:`_stop_connect`."""
    import socket

    from reconcile import connect_server
    from tiny_spark import TINY_DATA_CONF

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "JDK_JAVA_OPTIONS"}  # long-lived: full JIT
    if os.environ.get("JDK_JAVA_OPTIONS") == SHORT_LIVED_JVM_OPTIONS and LONG_LIVED_JVM_OPTIONS:
        env["JDK_JAVA_OPTIONS"] = LONG_LIVED_JVM_OPTIONS
    env.update(environment or {})
    # tables of a few dozen rows, as the in-process session's (tests/tiny_spark.py)
    conf = {"spark.sql.shuffle.partitions": "2", **(TINY_DATA_CONF if SPARK_MODE == "tiny" else {})}
    url = connect_server.start(port, "local[2]", home=home, env=env, warm=False, conf=conf)
    (home / "port").write_text(str(port))
    return url


def _stop_connect(home: Path) -> None:
    from reconcile import connect_server

    if (home / "port").exists():
        connect_server.stop(int((home / "port").read_text()), home=home)


def pytest_unconfigure(config):
    """The run's controller stops the Connect server a worker started."""
    if hasattr(config, "workerinput") or not hasattr(config, "_tmp_path_factory"):
        return
    shared = _shared_dir(config)
    if shared is not None and (shared / "connect-home").exists():
        _stop_connect(shared / "connect-home")


@pytest.fixture(scope="session")
def airflow_db():
    """Airflow's own database (SQLite in the session's private AIRFLOW_HOME), migrated once."""
    import subprocess

    Path(os.environ["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return os.environ["AIRFLOW_HOME"]


@pytest.fixture
def warehouse(tmp_path, monkeypatch):
    wh = tmp_path / "warehouse"
    wh.mkdir()
    monkeypatch.setenv("RECONCILE_WAREHOUSE", str(wh))
    return wh


def _pg_schema_url(base: str, schema: str) -> str:
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options=-csearch_path%3D{schema}"


@pytest.fixture
def pg_url():
    """A PostgreSQL URL with a fresh schema (dropped afterwards)."""
    if not PG_URL:
        if os.environ.get("CI"):
            pytest.fail("RECONCILE_TEST_POSTGRES_URL is not set under CI: PostgreSQL tests must run")
        pytest.skip("RECONCILE_TEST_POSTGRES_URL not set")
    from sqlalchemy import create_engine, text

    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_URL)
    with admin.begin() as c:
        c.execute(text(f"CREATE SCHEMA {schema}"))
    yield _pg_schema_url(PG_URL, schema)
    with admin.begin() as c:
        c.execute(text(f"DROP SCHEMA {schema} CASCADE"))
    admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path / 'metadata.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def metadata_url(request, tmp_path):
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("pg_url")


def _open_ledger(url, monkeypatch):
    """A Ledger on ``url``, also made the process's RECONCILE_METADATA_URL."""
    from reconcile.storage.ledger import Ledger

    monkeypatch.setenv("RECONCILE_METADATA_URL", url)
    s = Ledger(url)
    yield s
    s.dispose()


@pytest.fixture
def ledger(metadata_url, monkeypatch):
    yield from _open_ledger(metadata_url, monkeypatch)


@pytest.fixture
def sqlite_ledger(sqlite_url, monkeypatch):
    yield from _open_ledger(sqlite_url, monkeypatch)


@pytest.fixture(scope="session")
def s3_server_running(tmp_path_factory):
    """One S3 server (versitygw, harness/s3_server.py) per test process, on 127.0.0.1."""
    from harness import s3_server
    from object_store_harness import serve

    yield from serve(s3_server.start, tmp_path_factory.mktemp("s3"))


@pytest.fixture
def s3_warehouse(s3_server_running, spark, monkeypatch):
    """``RECONCILE_WAREHOUSE=s3://<bucket>/<fresh prefix>`` on the test S3 server, with the
    standard AWS environment variables a deployment sets (endpoint, region, credentials). This
    process's JVM started before they were in its environment, so S3A gets the credentials as
    per-bucket Hadoop conf of the test session (a deployment's JVM reads them from the
    environment: the sink never passes a secret as conf)."""
    import uuid

    server = s3_server_running
    for k, v in server.storage_options().items():
        monkeypatch.setenv(k, v)
    url = server.url(f"wh-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("RECONCILE_WAREHOUSE", url)
    conf = {k.removeprefix("spark.hadoop."): v for k, v in server.hadoop_conf(per_bucket=True).items()}
    for k, v in conf.items():
        spark.conf.set(k, v)
    yield url
    for k in conf:
        spark.conf.unset(k)


# The quick tier (`bash scripts/test.sh --quick`): every module's own tests, without the suites
# that start servers, Airflow or many JVMs (crashes by killing processes, races, randomized
# schedules, object stores, Spark Connect and cluster runs, the browser) and without the
# PostgreSQL twin of a test that also runs on SQLite: a few minutes, for iteration. The default
# run keeps everything.
HEAVY_FILES = {
    "test_adls.py",
    "test_airflow_native.py",
    "test_chaos.py",
    "test_cluster.py",
    "test_commit_lease.py",
    "test_connect.py",
    "test_crash.py",
    "test_install.py",
    "test_pages_browser.py",
    "test_races.py",
    "test_recipes.py",
    "test_s3.py",
    "test_s3_listing.py",
    "test_s3_store.py",
    "test_scheduler.py",
}


# The files that take longest, longest first (seconds summed per file in a fresh-clone run, two
# workers: test_crash 149, test_races 137 ... test_sink 39): they start first, so no worker is
# left alone with a long file at the end (scripts/test.sh passes --no-loadscope-reorder; xdist's
# own order, by number of tests, put the one-test Airflow files last). Other files follow in
# collection order. Only the order matters: refresh it from a run's --durations when it drifts.
LONGEST_FIRST = [
    "test_crash.py",
    "test_races.py",
    "test_current.py",
    "test_scheduler.py",
    "test_airflow_native.py",
    "test_install.py",
    "test_recipes.py",
    "test_chaos.py",
    "test_connect.py",
    "test_drift.py",
    "test_airflow.py",
    "test_reads.py",
    "test_cluster.py",
    "test_compaction.py",
    "test_upsert.py",
    "test_commit_lease.py",
    "test_bad_input.py",
    "test_s3.py",
    "test_sink.py",
    "test_dry_run.py",
]


def pytest_addoption(parser):
    parser.addoption("--quick", action="store_true", help="the quick tier: no server, Airflow-stack or slow suite")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file keeps its order
    if not config.getoption("--quick"):
        return
    keep, drop = [], []
    servers = {"s3_warehouse", "s3_server_running", "connect_url", "azurite"}  # a server of their own
    for item in items:
        heavy = item.path.name in HEAVY_FILES or item.get_closest_marker("slow") or item.get_closest_marker("airflow")
        heavy = heavy or bool(servers & set(getattr(item, "fixturenames", ())))
        params = set(getattr(getattr(item, "callspec", None), "id", "").split("-"))
        heavy = heavy or bool(params & {"postgres", "postgresql", "s3", "connect"})  # the SQLite, local twin stays
        (drop if heavy else keep).append(item)
    items[:] = keep
    config.hook.pytest_deselected(items=drop)
