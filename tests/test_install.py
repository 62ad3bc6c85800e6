"""Installed into an existing Airflow deployment (docs/install.md): the wheel built from this tree,
installed with uv into a fresh virtualenv with Airflow (requirements-lock.txt as constraints), a
fresh AIRFLOW_HOME whose dags folder holds only the two-line DAG file and whose plugins folder is
empty. That deployment's own ``airflow`` CLI lists the plugin (registered by the package's entry
point) and the sink's DAG with no import errors, and ``airflow dags test`` commits the sink's first
batch: the ledger (the installed ``reconcile`` command) says committed, the Delta table holds the
rows, and the state is in $AIRFLOW_HOME/reconcile/ (the installed default), not in the virtualenv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections import Counter
from pathlib import Path

import pytest
import yaml

from helpers import cli_json

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
PROJECT_BIN = Path(sys.executable).parent
DAG_FILE = "from reconcile.airflow.dags import build_dags\nglobals().update(build_dags({sinks!r}))\n"
ORDERS = [{"order_id": 1, "customer": "alice", "amount": 10.0}, {"order_id": 2, "customer": "bob", "amount": 5.5}]
# What the test process passes on to the fresh deployment: nothing of the project's environment
# (conftest's PYTHONPATH, RECONCILE_*, AIRFLOW_*), only what a machine has.
PASSED = ("HOME", "JAVA_HOME", "LANG", "LC_ALL", "TMPDIR", "JDK_JAVA_OPTIONS", "UV_CACHE_DIR")


def _uv(*args: str) -> str:
    """uv ``args``, from uv's cache first: scripts/setup.sh put every package of the lock there,
    and online uv revalidates each index page (the install: 50 s online, 2 s offline)."""
    uv = PROJECT_BIN / "uv"
    cmd = [str(uv) if uv.exists() else shutil.which("uv") or pytest.fail("no uv: run scripts/setup.sh"), *args]
    offline = subprocess.run([*cmd, "--offline"], capture_output=True, text=True, timeout=600)
    return offline.stdout if offline.returncode == 0 else _run(cmd)


def _run(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 600):
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this tree (its working copy), built from a copy so that nothing lands here."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src / "pyproject.toml")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "include" / "reconcile", src / "include" / "reconcile", ignore=ignore)
    shutil.copytree(ROOT / "jobs", src / "jobs", ignore=ignore)
    _uv("build", "-q", "--wheel", "-o", str(tmp / "dist"), str(src))
    (built,) = (tmp / "dist").glob("reconcile_sink-*.whl")
    return built


def test_the_wheel_holds_the_package_its_data_and_the_jobs(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    package = ROOT / "include" / "reconcile"
    shipped = [p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    expected = {f"reconcile/{p.relative_to(package)}" for p in shipped}
    expected |= {f"reconcile/jobs/{p.name}" for p in (ROOT / "jobs").glob("*.py")}
    assert {"reconcile/spark-log4j2.properties", "reconcile/storage/migrations/script.py.mako"} <= expected
    assert any(n.startswith("reconcile/storage/migrations/versions/") for n in expected)
    assert not expected - names, f"the wheel lacks {sorted(expected - names)}"


def test_installed_into_a_fresh_airflow_the_sink_runs(wheel, tmp_path):
    venv = tmp_path / "venv"
    _uv("venv", "-q", "-p", "3.11", str(venv))
    _uv(
        "pip",
        "install",
        "-q",
        "-p",
        str(venv / "bin" / "python"),
        str(wheel),
        "-c",
        str(ROOT / "requirements-lock.txt"),
    )

    # The deployment: its dags folder holds only the two-line DAG file, its plugins folder nothing.
    home = tmp_path / "airflow"
    for folder in ("dags", "plugins"):
        (home / folder).mkdir(parents=True)
    sinks, orders = tmp_path / "sinks", tmp_path / "orders"
    (home / "dags" / "reconcile_sinks.py").write_text(DAG_FILE.format(sinks=str(sinks)))
    sinks.mkdir(), orders.mkdir()
    sink = yaml.safe_load((ROOT / "include" / "sinks" / "demo_orders.yaml").read_text())
    sink["query"]["sources"]["orders"]["path"] = str(orders)
    (sinks / "demo_orders.yaml").write_text(yaml.safe_dump(sink, sort_keys=False))
    (orders / "orders.json").write_text("".join(json.dumps(r) + "\n" for r in ORDERS))

    path = [str(venv / "bin")] + [p for p in os.environ["PATH"].split(os.pathsep) if Path(p) != PROJECT_BIN]
    env = {k: os.environ[k] for k in PASSED if k in os.environ}
    env.update(
        PATH=os.pathsep.join(path),
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__PLUGINS_FOLDER=str(home / "plugins"),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS="reconcile.settings.AIRFLOW_SQLITE_CONNECT_ARGS",
        AIRFLOW_CONN_SPARK_DEFAULT=json.dumps({"conn_type": "spark", "host": "local[2]"}),
        RECONCILE_SPARK_JARS=str(ROOT / ".jars"),  # a folder of jars: no download from Maven
    )
    python = str(venv / "bin" / "python")
    where = _run([python, "-c", "import reconcile; print(reconcile.__file__)"], env, tmp_path)
    assert Path(where.strip()).is_relative_to(venv), f"reconcile imported from {where.strip()}, not the fresh install"

    def airflow(*args: str) -> subprocess.Popen:
        return subprocess.Popen(
            ["airflow", *args], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def done(proc: subprocess.Popen, timeout: float = 300, both: bool = False) -> str:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, (
            f"{' '.join(map(str, proc.args))} exited {proc.returncode}:\n{out[-3000:]}\n{err[-3000:]}"
        )
        return out + err if both else out

    migrate, plugins = airflow("db", "migrate"), airflow("plugins", "--output", "json")
    listed = {p["name"]: p for p in cli_json(done(plugins))}
    assert "reconcile" in listed, f"airflow plugins lists {sorted(listed)}, not reconcile"
    assert "reconcile-sink" in listed["reconcile"]["source"] and "airflow.plugins" in listed["reconcile"]["source"]
    assert [v["href"] for v in listed["reconcile"]["external_views"]] == ["/reconcile/"]
    done(migrate)

    # One real run: its tasks find the sink by name in the folder the DAG file named
    out = done(airflow("dags", "test", "demo_orders", "2026-01-02"), 600, both=True)
    assert "state=success" in out, out[-3000:]

    # The run parsed the dags folder as the deployment's dag-processor does (the whole bundle,
    # its import errors included) and wrote it to the database the CLI lists from.
    dags, errors = (
        airflow("dags", "list", "--output", "json"),
        airflow("dags", "list-import-errors", "--output", "json"),
    )
    assert [d["dag_id"] for d in cli_json(done(dags))] == ["demo_orders"]
    assert cli_json(done(errors)) == []

    cli_env = {**env, "RECONCILE_SINKS_DIR": str(sinks)}  # the command line names the folder itself
    status = json.loads(_run([str(venv / "bin" / "reconcile"), "status", "demo_orders", "--json"], cli_env, tmp_path))
    (batch,) = status["batches"]
    assert (batch["state"], batch["rows_ok"], batch["delta_version"]) == ("committed", 2, 1), batch
    assert status["upper"]["iso"] == "2026-01-02T00:00:00.000Z"

    from deltalake import DeltaTable

    state = home / "reconcile"
    assert (state / "metadata.db").is_file()
    rows = DeltaTable(str(state / "warehouse" / "demo_orders")).to_pyarrow_table().to_pylist()
    shard = Counter()
    for r in rows:
        shard[(r["customer"], r["orders"], str(r["total"]))] += r["_diff"]
    assert +shard == Counter({("alice", 1, "10.00"): 1, ("bob", 1, "5.50"): 1})
    assert not list(venv.rglob(".reconcile")), "state written inside the virtualenv"
