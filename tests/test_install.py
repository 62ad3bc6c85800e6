"""Installed into an existing Airflow deployment exactly as docs/install.md says. The deployment: a
fresh virtualenv where ``pip install apache-airflow==3.3.2`` brought whatever Airflow 3.3 brings
today (uv installs it here: the same packages as pip's, 2 s instead of 17). install.md's own
commands then run as printed (its ``install`` block, in a copy of this tree: the deployment's pip
builds the wheel and installs it, no constraint file): no package the deployment had goes down or
away (packaging's version order), and ``pip check`` passes. A fresh AIRFLOW_HOME whose dags folder
holds only the two-line DAG file and whose plugins folder is empty: that deployment's own
``airflow`` CLI lists the plugin (registered by the package's entry point), install.md's ``parse``
block puts the sink's DAG in the database the CLI lists from, with no import errors, and
``airflow dags test`` commits the sink's first batch: the ledger (the installed ``reconcile``
command) says committed, the Delta table holds the rows, and the state is in
$AIRFLOW_HOME/reconcile/ (the installed default), not in the virtualenv.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections import Counter
from pathlib import Path

import pytest
import yaml
from packaging.utils import canonicalize_name
from packaging.version import Version

from helpers import cli_json

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
INSTALL_MD = ROOT / "docs" / "install.md"
PROJECT_BIN = Path(sys.executable).parent
AIRFLOW = "apache-airflow==3.3.2"  # the deployment, as its own `pip install` has it
DAG_FILE = "from reconcile.airflow.dags import build_dags\nglobals().update(build_dags({sinks!r}))\n"
ORDERS = [{"order_id": 1, "customer": "alice", "amount": 10.0}, {"order_id": 2, "customer": "bob", "amount": 5.5}]
# What the test process passes on to the fresh deployment: nothing of the project's environment
# (conftest's PYTHONPATH, RECONCILE_*, AIRFLOW_*, the project's virtualenv), only what a machine has:
# these, and its pip's and uv's settings (PIP_*, UV_*: an index, a cache, certificates).
PASSED = ("HOME", "JAVA_HOME", "LANG", "LC_ALL", "TMPDIR", "JDK_JAVA_OPTIONS", "SSL_CERT_FILE", "SSL_CERT_DIR")
PASSED_PREFIXES = ("PIP_", "UV_", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")


def recipe(name: str) -> str:
    """The bash block that follows ``<!-- recipe: name -->`` in docs/install.md."""
    found = re.search(rf"<!-- recipe: {name} -->\s*```bash\n(.*?)```", INSTALL_MD.read_text(), re.S)
    assert found, f"docs/install.md has no recipe {name!r}"
    return found.group(1)


def machine_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in PASSED or k.startswith(PASSED_PREFIXES)}
    return {**env, **extra}


def _uv(*args: str) -> str:
    """uv ``args``, from uv's cache first: scripts/setup.sh put every package of the lock there,
    and online uv revalidates each index page."""
    uv = PROJECT_BIN / "uv"
    cmd = [str(uv) if uv.exists() else shutil.which("uv") or pytest.fail("no uv: run scripts/setup.sh"), *args]
    offline = subprocess.run([*cmd, "--offline"], capture_output=True, text=True, timeout=600)
    return offline.stdout if offline.returncode == 0 else _run(cmd)


def _run(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 900):
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


def _bash(script: str, env: dict[str, str], cwd: Path) -> str:
    """A block of install.md as printed, run by bash as a person pastes it (stopping at an error)."""
    return _run(["bash", "-c", f"set -euo pipefail\n{script}"], env, cwd)


def checkout(dst: Path) -> Path:
    """What a checkout holds for the build (the working copy of this tree), so that nothing the
    build leaves (build/, dist/, *.egg-info) lands here."""
    dst.mkdir(parents=True)
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "include" / "reconcile", dst / "include" / "reconcile", ignore=ignore)
    shutil.copytree(ROOT / "jobs", dst / "jobs", ignore=ignore)
    return dst


def installed(python: Path, env: dict[str, str]) -> dict[str, Version]:
    listed = json.loads(_run([str(python), "-m", "pip", "list", "--format", "json"], env))
    return {canonicalize_name(p["name"]): Version(p["version"]) for p in listed}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this tree, built by uv (quick, from its cache)."""
    tmp = tmp_path_factory.mktemp("wheel")
    _uv("build", "-q", "--wheel", "-o", str(tmp / "dist"), str(checkout(tmp / "src")))
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


def test_installed_into_a_fresh_airflow_the_sink_runs(tmp_path):
    # The deployment: a virtualenv of this Python with Airflow, as `pip install` brings it today
    venv, bin_ = tmp_path / "venv", tmp_path / "venv" / "bin"
    path = [str(bin_)] + [p for p in os.environ["PATH"].split(os.pathsep) if Path(p) != PROJECT_BIN]
    env = machine_env(PATH=os.pathsep.join(path), PIP_DISABLE_PIP_VERSION_CHECK="1")
    _run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], env)
    python = bin_ / "python"
    # (uv stands in for the deployment's own pip here: the same packages, measured, in 2 s, not 17)
    _uv("pip", "install", "-q", "-p", str(python), "-U", "pip", AIRFLOW)
    before = installed(python, env)
    assert before["apache-airflow"] == Version(AIRFLOW.split("==")[1])

    # install.md's commands as printed, in a checkout, with the deployment's pip on PATH
    _bash(recipe("install"), env, checkout(tmp_path / "checkout"))
    after = installed(python, env)
    assert "reconcile-sink" in after
    changed = {n: f"{v} -> {after.get(n, 'removed')}" for n, v in before.items() if n not in after or after[n] < v}
    assert not changed, f"installing the wheel downgraded or removed the deployment's {changed}"
    _run([str(python), "-m", "pip", "check"], env)

    # Its AIRFLOW_HOME: the dags folder holds only the two-line DAG file, the plugins folder nothing.
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

    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__PLUGINS_FOLDER=str(home / "plugins"),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS="reconcile.settings.AIRFLOW_SQLITE_CONNECT_ARGS",
        AIRFLOW_CONN_SPARK_DEFAULT=json.dumps({"conn_type": "spark", "host": "local[2]"}),
        RECONCILE_SPARK_JARS=str(ROOT / ".jars"),  # a folder of jars: no download from Maven
    )
    where = _run([str(python), "-c", "import reconcile; print(reconcile.__file__)"], env, tmp_path)
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

    # install.md's parse step as printed: then the CLI lists the sink's DAG, with no import errors.
    _bash(recipe("parse"), env, tmp_path)
    dags, errors = (
        airflow("dags", "list", "--output", "json"),
        airflow("dags", "list-import-errors", "--output", "json"),
    )
    assert [d["dag_id"] for d in cli_json(done(dags))] == ["demo_orders"]
    assert cli_json(done(errors)) == []

    # One real run: its tasks find the sink by name in the folder the DAG file named
    out = done(airflow("dags", "test", "demo_orders", "2026-01-02"), 600, both=True)
    assert "state=success" in out, out[-3000:]

    cli_env = {**env, "RECONCILE_SINKS_DIR": str(sinks)}  # the command line names the folder itself
    status = json.loads(_run([str(bin_ / "reconcile"), "status", "demo_orders", "--json"], cli_env, tmp_path))
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
