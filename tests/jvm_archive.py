"""A class-data-sharing archive for the tests' short-lived Spark JVMs: ``python tests/jvm_archive.py``
prints its path, building it first if this machine has none for its JDK and jars.

Every spark-submit job, racer and executor the suite starts loads the same few thousand classes
of Spark and Delta; a JDK 17 dynamic archive (``-XX:ArchiveClassesAtExit``) of them, recorded
once from a small Delta job, lets each later JVM map them instead of parsing them again.
Measured side by side: that job 12.8 s -> 8.1-10.0 s. A JVM whose class path differs (or any
JVM after the JDK or the jars changed) ignores the archive; its warning is switched off
(``-Xlog:cds*=off``). ``scripts/test.sh`` passes the path to the tests in
``RECONCILE_TEST_JVM_ARCHIVE``; tests/conftest.py adds it to the short-lived JVMs' options.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

JOB = """
import sys
sys.path.insert(0, {include!r})
from reconcile.spark import get_session
spark = get_session("jvm-archive", {{"spark.sql.shuffle.partitions": "2"}})
path = {path!r}
df = spark.range(100).selectExpr("id AS k", "CAST(id AS STRING) AS v")
df.repartition(2, "k").write.format("delta").mode("overwrite").save(path)
spark.read.format("delta").load(path).groupBy("v").count().collect()
df.write.mode("overwrite").partitionBy("k").parquet(path + "-parquet")
spark.stop()
"""


def archive_path() -> Path:
    """Where this machine's archive is: named by the JDK and the jars it was recorded with."""
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    jars = sorted(p.name for p in (ROOT / ".jars").glob("*.jar"))
    key = hashlib.sha256("\n".join([java, pyspark.__version__, *jars]).encode()).hexdigest()[:12]
    return ROOT / ".jars" / f"test-jvm-{key}.jsa"


def build(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.py"
        job.write_text(JOB.format(include=str(ROOT / "include"), path=str(Path(tmp) / "t")))
        env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_GATEWAY_PORT", "RECONCILE_SPARK_REMOTE")}
        part = out.with_suffix(".part")
        env["JDK_JAVA_OPTIONS"] = f"-XX:ArchiveClassesAtExit={part} -Xlog:cds*=off"
        proc = subprocess.run([sys.executable, str(job)], env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 or not part.exists():
            raise SystemExit(f"tests/jvm_archive.py: recording the archive failed: {proc.stderr[-2000:]}")
        part.rename(out)


if __name__ == "__main__":
    path = archive_path()
    if not path.exists():
        for old in path.parent.glob("test-jvm-*.jsa"):
            old.unlink()
        build(path)
    print(path)
