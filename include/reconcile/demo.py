"""The demo: the ``demo_orders`` sink run through Airflow for a few daily intervals.

Each day the raw orders change (new orders, a corrected amount, a cancelled customer, an order
without a customer that becomes an error row); each run writes only the difference. After each
run the shard's frontiers, ledger and contents are printed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from reconcile import settings

LOG_LINE = re.compile(r"^\S+\s+\[\w+\s*\]\s+(.*?)\s+\[[\w.]+\]")
DAYS: list[list[tuple[str | None, float]]] = [
    [("alice", 10.0), ("bob", 5.5), ("carol", 7.25)],
    [("alice", 10.0), ("alice", 2.0), ("bob", 6.5), ("carol", 7.25), ("dave", 1.0), (None, 3.0)],
    [("alice", 10.0), ("alice", 2.0), ("bob", 6.5), ("dave", 1.0), ("erin", 4.0), (None, 2.5)],
]


def embedded_env() -> dict[str, str]:
    """The embedded default's environment (mirrors scripts/env.sh)."""
    root = settings.PROJECT_ROOT
    home = settings.home()
    env = dict(os.environ)
    env.setdefault("RECONCILE_HOME", str(home))
    env.setdefault("AIRFLOW_HOME", str(home / "airflow"))
    env.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(root / "dags"))
    env.setdefault("AIRFLOW__CORE__PLUGINS_FOLDER", str(root / "plugins"))
    env.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    env.setdefault("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{root / 'include'}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep)
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    return env


def write_orders(day: int) -> None:
    folder = settings.home() / "demo" / "orders"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "orders.json", "w") as f:
        for i, (customer, amount) in enumerate(DAYS[day]):
            f.write(json.dumps({"order_id": i, "customer": customer, "amount": amount}) + "\n")


def run_demo(intervals: int = 3, sink: str = "demo_orders") -> int:
    env = embedded_env()
    os.environ.update({k: env[k] for k in ("RECONCILE_HOME",)})
    logs = settings.home() / "demo" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    print(
        f"embedded default: RECONCILE_HOME={env['RECONCILE_HOME']} (metadata {settings.metadata_url()}, "
        f"warehouse {settings.warehouse()})"
    )
    subprocess.run(
        ["airflow", "db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    start = datetime(2026, 1, 2, tzinfo=UTC)
    from reconcile.config_loading import load_sink
    from reconcile.report import print_status, show_shard, status_data
    from reconcile.storage.ledger import Ledger

    for i in range(intervals):
        write_orders(min(i, len(DAYS) - 1))
        day = start + timedelta(days=i)
        log_file = logs / f"{sink}-{day:%Y%m%d}.log"
        print(f"\n=== run {i + 1}: airflow dags test {sink} {day:%Y-%m-%d} (log: {log_file})")
        with open(log_file, "w") as out:
            proc = subprocess.run(
                ["airflow", "dags", "test", sink, day.isoformat()], env=env, stdout=out, stderr=subprocess.STDOUT
            )
        for line in log_file.read_text().splitlines():
            m = LOG_LINE.match(line)
            if m and ("RECONCILE" in m.group(1) or "| sink=" in m.group(1)):
                print("  " + m.group(1)[:400])
        if proc.returncode != 0:
            print(f"run failed (exit {proc.returncode}); see {log_file}")
            return proc.returncode
    ledger = Ledger(settings.metadata_url())
    cfg = load_sink(sink)
    print()
    print_status(status_data(ledger, sink))
    # read without a JVM (DuckDB over delta-rs)
    show_shard(None, ledger, cfg, None, log=False, errors=False, limit=20)
    show_shard(None, ledger, cfg, None, log=False, errors=True, limit=20)
    show_shard(None, ledger, cfg, None, log=True, errors=False, limit=40)
    return 0
