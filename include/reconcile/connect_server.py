"""A long-lived Spark Connect server for the sink's Spark jobs (``python -m reconcile spark-server``).

A run's ``write`` (and ``compact``) otherwise starts a JVM of its own with spark-submit: ~15 s
on 2 cores before any row is read. Against a Connect server the job is a client in the Airflow
worker (or the CLI) and pays only its data work. The server is started from the installed
pyspark with the Delta jars and the sink's Spark conf (:data:`reconcile.spark.SINK_CONF`); in
production point ``RECONCILE_SPARK_REMOTE`` (CLI) or a ``spark_connect`` Airflow connection
(DAGs) at any Connect server configured the same way.

Killing a client does not stop the query it started on the server: a write of a killed task
may still finish staging its files. The protocol is indifferent to that (each write attempt
stages in its own directory and only the attempt whose manifest is recorded is ever committed).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from reconcile import settings
from reconcile.spark import LOCAL_CONF, LOCAL_SQL_CONF, SINK_CONF

log = logging.getLogger(__name__)
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_PORT = 15002


def state_dir(home: Path | None = None) -> Path:
    """Where the servers this module starts keep their pid and log files."""
    path = (home or settings.home()) / "spark-connect"
    path.mkdir(parents=True, exist_ok=True)
    return path


def url(port: int, host: str = "127.0.0.1") -> str:
    return f"sc://{host}:{port}"


def command(port: int, master: str, extra: dict[str, str] | None = None) -> list[str]:
    """spark-submit of a Connect server on ``port``: Delta, the sink's conf, sized like the
    embedded default when ``master`` is local; ``extra`` conf last (it wins)."""
    conf = {**SINK_CONF, **settings.metastore_conf(), "spark.connect.grpc.binding.port": str(port)}
    jars = settings.spark_jars()
    conf["spark.jars" if jars else "spark.jars.packages"] = ",".join(jars) if jars else settings.DELTA_PACKAGES
    if master.startswith("local"):
        conf.update(LOCAL_CONF)
        conf.update(LOCAL_SQL_CONF)
    conf.update(extra or {})
    spark_submit = Path(sys.executable).parent / "spark-submit"
    args = [str(spark_submit if spark_submit.exists() else "spark-submit"), "--master", master, "--class", SERVER_CLASS]
    args += ["--name", f"reconcile-spark-connect-{port}"]
    for k, v in conf.items():
        args += ["--conf", f"{k}={v}"]
    return [*args, "spark-internal"]


def listening(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _pid(port: int, home: Path | None = None) -> int | None:
    f = state_dir(home) / f"{port}.pid"
    try:
        pid = int(f.read_text())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def start(
    port: int = DEFAULT_PORT,
    master: str | None = None,
    *,
    home: Path | None = None,
    env: dict[str, str] | None = None,
    warm: bool = True,
    timeout: float = 120.0,
    conf: dict[str, str] | None = None,
) -> str:
    """Start a server on ``port`` unless one listens there already; returns its URL once it
    accepts connections and (``warm``) has run a throwaway batch (:func:`warm_up`). Its pid and
    log files are in ``<home>/spark-connect/`` (default ``$RECONCILE_HOME``); ``env`` replaces
    the process environment of the server; ``conf``, Spark conf beyond the sink's."""
    if listening(port):
        return url(port)
    log = state_dir(home) / f"{port}.log"
    env = dict(os.environ if env is None else env)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env.pop("PYSPARK_GATEWAY_PORT", None)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            command(port, master or settings.spark_master(), conf),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # outlives the command that started it
        )
    (state_dir(home) / f"{port}.pid").write_text(str(proc.pid))
    deadline = time.monotonic() + timeout
    while not listening(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(port, home=home)
            tail = log.read_text(errors="replace").splitlines()[-5:]
            raise RuntimeError(f"Spark Connect server on port {port} did not start (log {log}): {' / '.join(tail)}")
        time.sleep(0.5)
    if warm:
        warm_up(url(port))
    return url(port)


WARM_SINK = """name: warm_up
kind: query
schema:
  - {name: k, type: bigint, nullable: false}
  - {name: v, type: string}
  - {name: d, type: "decimal(12,2)"}
partitions: 4
start_date: 1970-01-01
as_of: 100
query:
  sources:
    src: {format: json, path: src}
  sql: SELECT k, v, CAST(sum(d) AS DECIMAL(12,2)) AS d FROM src GROUP BY k, v
"""


def warm_up(address: str) -> int:
    """Run a throwaway query sink twice against the server at ``address`` (``python -m
    reconcile run`` in a temporary home): the server's JVM loads and compiles what a batch
    needs before the first real run pays for it (a first run on a cold server took 26.8 s in
    ``airflow dags test``, later ones 16.2 s). Returns how many of its 2 batches it appended;
    a failure is logged (the server works, its first run is slower)."""
    import tempfile

    appended = 0
    with tempfile.TemporaryDirectory(prefix="reconcile-warm-") as tmp:
        root = Path(tmp)
        (root / "warm_up.yaml").write_text(WARM_SINK)
        (root / "src").mkdir()
        env = {k: v for k, v in os.environ.items() if k != "PYSPARK_GATEWAY_PORT"}
        env.update(
            {
                "RECONCILE_HOME": str(root),
                "RECONCILE_SINKS_DIR": str(root),
                "RECONCILE_WAREHOUSE": str(root / "warehouse"),
                "RECONCILE_METADATA_URL": f"sqlite:///{root / 'metadata.db'}",
                "RECONCILE_SPARK_REMOTE": address,
            }
        )
        for frontier, rows in ((200, range(3)), (300, range(1, 5))):
            (root / "src" / "part.json").write_text("".join(f'{{"k": {k}, "v": "v{k}", "d": {k}.5}}\n' for k in rows))
            cmd = [sys.executable, "-m", "reconcile", "run", "warm_up", "--frontier", str(frontier)]
            proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=600, check=False)
            if proc.returncode != 0 or "appended batch" not in proc.stdout:
                tail = " / ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
                log.warning("warm-up batch on %s failed (the server works; its first run is slower): %s", address, tail)
                break
            appended += 1
    return appended


def stop(port: int = DEFAULT_PORT, *, home: Path | None = None, timeout: float = 30.0) -> bool:
    """Stop the server this module started on ``port``; False if there was none."""
    pid = _pid(port, home)
    (state_dir(home) / f"{port}.pid").unlink(missing_ok=True)
    if pid is None:
        return False
    try:
        os.killpg(pid, signal.SIGTERM)
    except OSError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.2)
    os.killpg(pid, signal.SIGKILL)
    return True


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs. A server this process started and that has exited is a zombie
    until reaped (``kill(pid, 0)`` still succeeds on it): reap it here."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:  # not our child: init reaps it
        pass
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def status(port: int = DEFAULT_PORT) -> str:
    pid = _pid(port)
    if listening(port):
        return f"listening at {url(port)}" + (f" (pid {pid})" if pid else " (not started by this command)")
    return f"not running on port {port}" + (f" (pid {pid} starting or hung)" if pid else "")
