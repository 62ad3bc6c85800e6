"""A Hive metastore service (``thrift://``) for the tests: Hive's standalone metastore server
from the Hive jars pyspark ships (``hive-metastore-2.3.*.jar``, the version of Spark's own Hive
client), over a Derby database in a folder of the caller's, on a free port of 127.0.0.1, ended
with the process that started it. What production runs as docker-compose.yaml's metastore, with
no image and no network: only Java and pyspark."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

from harness.emulator_server import die_with_parent, free_port, terminate, wait_until_up


class JavaMissing(RuntimeError):
    """No Java to run the metastore server with."""


def java() -> str:
    """The ``java`` of ``JAVA_HOME``, else the one on PATH (JavaMissing if neither)."""
    home = os.environ.get("JAVA_HOME")
    found = (
        str(Path(home) / "bin" / "java") if home and (Path(home) / "bin" / "java").exists() else shutil.which("java")
    )
    if not found:
        raise JavaMissing(
            "java is missing: install a JDK 17 (apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
        )
    return found


def pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def server_argv(base: Path, port: int) -> list[str]:
    """The command line of a metastore server on ``port`` whose Derby database and warehouse are
    under ``base``. Hive reads its settings from system properties too (no hive-site.xml); its
    asynchronous logging needs a jar pyspark does not ship, so it is off."""
    props = {
        "javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={base / 'metastore_db'};create=true",
        "derby.system.home": str(base),
        "datanucleus.schema.autoCreateAll": "true",
        "hive.metastore.schema.verification": "false",
        "hive.metastore.warehouse.dir": str(base / "warehouse"),
        "hive.async.log.enabled": "false",
    }
    return [
        java(),
        *(f"-D{k}={v}" for k, v in props.items()),
        "-cp",
        f"{pyspark_jars()}/*",
        "org.apache.hadoop.hive.metastore.HiveMetaStore",
        "-p",
        str(port),
    ]


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


@contextlib.contextmanager
def metastore_service(base: Path, timeout: float = 180.0) -> Iterator[str]:
    """A running metastore server (see the module doc) with its files in ``base``; yields its
    ``thrift://127.0.0.1:PORT`` URI once the port accepts connections. Its output goes to
    ``base/metastore.log`` (named in the error when it does not start)."""
    base.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = base / "metastore.log"
    env = {k: v for k, v in os.environ.items() if k not in ("JDK_JAVA_OPTIONS", "HADOOP_CONF_DIR", "HIVE_CONF_DIR")}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            server_argv(base, port), stdout=out, stderr=subprocess.STDOUT, cwd=base, env=env, preexec_fn=die_with_parent
        )
    try:
        wait_until_up(
            proc,
            lambda: _answers(port),
            timeout,
            lambda: (
                f"the metastore server did not start on port {port} (exit {proc.poll()}): "
                + log.read_text(errors="replace")[-3000:]
            ),
        )
        yield f"thrift://127.0.0.1:{port}"
    finally:
        terminate(proc)
