"""The shell scripts keep a value already set: scripts/env.sh sourced once or twice, with nothing set
beforehand or with every variable set (a Spark connection and a Spark Connect one among them),
leaves each variable at its exact expected value; no script's ``${VAR:-default}`` holds a brace a
preset value would get appended (issue 51: sourcing env.sh twice turned the Spark connection into
``{...}}``, and every scheduled write failed). Bash only: no JVM.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV_SH = ROOT / "scripts" / "env.sh"
# The shell the scripts run under: a clean one, not the test process's environment.
BASE = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"}
SPARK = '{"conn_type": "spark", "host": "spark://spark-master", "port": 7077, "extra": {"deploy-mode": "client"}}'
SPARK_CONNECT = '{"conn_type": "spark_connect", "host": "sc://connect.example:15002/;use_ssl=true", "port": 15002}'


def _exported_names() -> list[str]:
    return sorted(set(re.findall(r"export (\w+)=", ENV_SH.read_text())))


def _source(root: Path, times: int, preset: dict[str, str]) -> dict[str, str]:
    """The environment after sourcing ``root/scripts/env.sh`` ``times`` times, read back with ``env -0``."""
    script = ". scripts/env.sh\n" * times + "env -0\n"
    r = subprocess.run(
        ["bash", "-c", script], cwd=root, env={**BASE, **preset}, capture_output=True, timeout=60, check=False
    )
    assert r.returncode == 0, r.stderr.decode()
    return dict(entry.split("=", 1) for entry in r.stdout.decode().split("\0") if entry)


@pytest.fixture
def root(tmp_path) -> Path:
    """A checkout of its own (env.sh finds the root from its own path): nothing is made in this one."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ENV_SH, tmp_path / "scripts" / "env.sh")
    return tmp_path


@pytest.mark.parametrize("times", [1, 2, 3])
def test_env_sh_defaults_are_exact_however_often_sourced(root, times):
    env = _source(root, times, {})
    expected = {
        "RECONCILE_HOME": f"{root}/.reconcile",
        "AIRFLOW_HOME": f"{root}/.reconcile/airflow",
        "AIRFLOW__CORE__DAGS_FOLDER": f"{root}/dags",
        "AIRFLOW__CORE__PLUGINS_FOLDER": f"{root}/plugins",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": "http://127.0.0.1:8080/execution/",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS": "reconcile.settings.AIRFLOW_SQLITE_CONNECT_ARGS",
        "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type": "spark", "host": "local[2]"}',
        "PATH": f"{root}/.venv/bin:{BASE['PATH']}",
        "PYSPARK_PYTHON": f"{root}/.venv/bin/python",
        "PYTHONPATH": f"{root}/include",
    }
    assert set(expected) == set(_exported_names()), "a variable env.sh exports is not checked here"
    assert {name: env.get(name) for name in expected} == expected
    # the default is a connection Airflow parses: JSON of a local Spark
    assert json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"]) == {"conn_type": "spark", "host": "local[2]"}
    assert (root / ".reconcile" / "airflow").is_dir()
    assert "_root" not in env and "_spark" not in env  # its helpers do not leak


@pytest.mark.parametrize("conn", [SPARK, SPARK_CONNECT], ids=["spark", "spark_connect"])
@pytest.mark.parametrize("times", [1, 2])
def test_env_sh_keeps_every_preset_value_exactly(root, tmp_path_factory, conn, times):
    home = tmp_path_factory.mktemp("home")
    preset = {
        "RECONCILE_HOME": str(home),
        "AIRFLOW_HOME": str(home / "af"),
        "AIRFLOW__CORE__DAGS_FOLDER": "/opt/dags",
        "AIRFLOW__CORE__PLUGINS_FOLDER": "/opt/plugins",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "True",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "True",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "DEBUG",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": "http://api.example:9999/execution/",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS": "my.module.ARGS",
        "AIRFLOW_CONN_SPARK_DEFAULT": conn,
        "PYSPARK_PYTHON": "/usr/bin/python3",
        "PYTHONPATH": "/opt/lib",
    }
    assert set(preset) | {"PATH"} == set(_exported_names())
    env = _source(root, times, preset)
    assert {name: env.get(name) for name in preset} == {
        **preset,
        "PYTHONPATH": f"{root}/include:/opt/lib",  # the package first, once; the rest kept
    }
    assert json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"]) == json.loads(conn)
    assert env["PATH"] == f"{root}/.venv/bin:{BASE['PATH']}"


def test_env_sh_port_moves_the_default_execution_url(root):
    env = _source(root, 2, {"AIRFLOW_PORT": "8181"})
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:8181/execution/"


# ${NAME:-default} (or :=, -, =, :+, +) whose default holds a `{` that does not open a nested ${...}:
# bash ends the expansion at the default's first `}`.
_BRACED_DEFAULT = re.compile(r"\$\{\w+:?[-=+?](?:[^}$]|\$(?!\{))*(?<!\$)\{")


def _scripts() -> list[Path]:
    found = [*ROOT.glob("scripts/*.sh"), ROOT / ".ci" / "run", *ROOT.glob("docker/**/*")]
    return sorted(p for p in found if p.is_file() and not p.name.endswith((".xml", ".sql")))


def test_no_script_default_holds_a_brace():
    assert ENV_SH in _scripts()
    bad = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in _scripts()
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if _BRACED_DEFAULT.search(line)
    ]
    assert not bad, "a default with a brace ends early; give it a variable of its own:\n" + "\n".join(bad)
    # the pattern itself: it finds the old env.sh line and passes nested expansions
    assert _BRACED_DEFAULT.search('X="${X:-{\\"conn_type\\": \\"spark\\"}}"')
    assert not _BRACED_DEFAULT.search('U="${U:-http://h:${PORT:-8080}/x/}"')
    assert not _BRACED_DEFAULT.search('X="${X:-$_spark}"')
