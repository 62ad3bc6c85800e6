"""Static checks of docker-compose.yaml (the production shape); no Docker engine needed."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yaml"
REQUIRED = {
    "postgres",
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "spark-master",
    "spark-worker",
}
AIRFLOW3_COMMANDS = {"api-server", "scheduler", "dag-processor", "triggerer"}
GENERATED = {"./.jars": "scripts/fetch_jars.sh"}  # bind source -> the script that creates it
DEPLOYED = [
    "dags/reconcile_sinks.py",
    "jobs/write_correction.py",
    "requirements.txt",
    "scripts/fetch_jars.sh",
    "docker/postgres-init/01-databases.sql",
]
VAR = re.compile(r"(?<!\$)\$(?:\{(\w+)([^}]*)\}|(\w+))")  # $$ is compose's escape


@pytest.fixture(scope="module")
def services():
    return yaml.safe_load(COMPOSE.read_text())["services"]


def group(services, prefix):
    return {n: s for n, s in services.items() if n.startswith(prefix)}


def mounts(svc):
    """(source, target) of each volume entry, short or long syntax."""
    for v in svc.get("volumes", []):
        yield (v["source"], v["target"]) if isinstance(v, dict) else tuple(v.split(":")[:2])


def env(svc):
    e = svc.get("environment", {})
    return e if isinstance(e, dict) else dict(x.split("=", 1) for x in e)


def tokens(value):
    return shlex.split(value) if isinstance(value, str) else [str(t) for t in value or []]


def strings(node):
    """Every string (keys too) in the loaded YAML: what compose interpolates; comments excluded."""
    if isinstance(node, dict):
        node = [*node.keys(), *node.values()]
    if isinstance(node, list):
        for item in node:
            yield from strings(item)
    elif isinstance(node, str):
        yield node


def test_required_services_exist(services):
    assert not REQUIRED - set(services), f"docker-compose.yaml lacks {sorted(REQUIRED - set(services))}"


def test_airflow_services_run_airflow3_commands(services):
    seen = set()
    for name, svc in group(services, "airflow-").items():
        if name == "airflow-init":
            assert "db migrate" in " ".join(tokens(svc["command"])), "airflow-init must run `airflow db migrate`"
            continue
        cmd = [t for t in tokens(svc.get("command")) if t != "airflow"]
        assert cmd and cmd[0] in AIRFLOW3_COMMANDS, f"{name}: command {cmd} is not an Airflow 3 command"
        seen.add(cmd[0])
    assert seen == AIRFLOW3_COMMANDS, f"no service runs {sorted(AIRFLOW3_COMMANDS - seen)}"


def test_startup_ordering(services):
    assert "pg_isready" in " ".join(tokens(services["postgres"]["healthcheck"]["test"])), "postgres: no pg_isready"
    for name, svc in group(services, "airflow-").items():
        deps = svc.get("depends_on", {})
        assert deps.get("postgres", {}).get("condition") == "service_healthy", f"{name}: not gated on postgres"
        if name != "airflow-init":
            assert deps.get("airflow-init", {}).get("condition") == "service_completed_successfully", (
                f"{name}: not gated on airflow-init completing"
            )


def test_host_paths_exist(services):
    for name, svc in services.items():
        for source, _ in mounts(svc):
            if source in GENERATED:
                assert (ROOT / GENERATED[source]).is_file(), f"{name}: {source} needs {GENERATED[source]}"
            elif source.startswith("./"):
                assert (ROOT / source).exists(), f"{name}: bind-mount source {source} missing"
        build = svc.get("build", {})
        build = build if isinstance(build, dict) else {"context": build}
        if build:
            context = ROOT / build.get("context", ".")
            dockerfile = context / build.get("dockerfile", "Dockerfile")
            assert context.is_dir() and dockerfile.is_file(), f"{name}: build {context} / {dockerfile} missing"


def test_variables_have_defaults():
    example = ROOT / ".env.example"
    defined = set(re.findall(r"^(\w+)=", example.read_text(), re.M)) if example.exists() else set()
    for text in strings(yaml.safe_load(COMPOSE.read_text())):
        for braced, rest, bare in VAR.findall(text):
            var = braced or bare
            has_default = bool(braced) and rest.startswith((":-", "-"))
            assert has_default or var in defined, f"${var} in {text!r} has no default and is not in .env.example"


def test_airflow_env_and_shared_warehouse(services):
    airflow, spark = group(services, "airflow-"), group(services, "spark-")
    paths = set()
    for name, svc in airflow.items():
        for var in ("RECONCILE_METADATA_URL", "RECONCILE_WAREHOUSE"):
            assert env(svc).get(var), f"{name}: {var} not set"
        paths.add(env(svc)["RECONCILE_WAREHOUSE"])
        jars_dir = dict(mounts(svc)).get("./.jars")
        for jar in env(svc).get("RECONCILE_SPARK_JARS", "").split(","):
            assert jars_dir and jar.startswith(jars_dir + "/"), f"{name}: jar {jar} is outside the ./.jars mount"
    assert len(paths) == 1, f"Airflow services disagree on RECONCILE_WAREHOUSE: {paths}"
    for name, svc in {**airflow, **spark}.items():
        targets = [t for s, t in mounts(svc) if s == "warehouse"]
        assert targets == list(paths), f"{name}: warehouse volume mounted at {targets}, expected {paths}"


@pytest.mark.parametrize("path", DEPLOYED)
def test_deployed_file_exists(path):
    assert (ROOT / path).is_file(), f"{path} missing (the compose deployment relies on it)"


def test_files_named_in_commands_exist(services):
    for line in (ROOT / "docker/airflow.Dockerfile").read_text().splitlines():
        if line.startswith("COPY") and "--from" not in line:
            for src in [t for t in line.split()[1:-1] if not t.startswith("--")]:
                assert (ROOT / src).exists(), f"docker/airflow.Dockerfile: COPY source {src} missing"
    for name, svc in services.items():
        binds = {t: s for s, t in mounts(svc) if s.startswith("./")}
        for tok in tokens(svc.get("command")) + tokens(svc.get("entrypoint")):
            for target, source in binds.items():
                if tok.startswith(target + "/"):
                    host = ROOT / source / tok[len(target) + 1 :]
                    assert host.exists(), f"{name}: command names {tok}, but {host} is missing"


def test_requirements_cover_the_images():
    lines = [ln.split("#")[0].strip() for ln in (ROOT / "requirements.txt").read_text().splitlines()]
    lines = [ln for ln in lines if ln]
    local = [ln for ln in lines if ln.startswith(("-e", ".", "/")) or ln == "."]
    assert not local, f"requirements.txt: {local} (the Dockerfile copies only requirements.txt)"
    names = {re.match(r"[\w.-]+", ln).group().lower().replace("_", "-"): ln for ln in lines if ln[0].isalnum()}
    for pkg in ("pyspark", "delta-spark", "apache-airflow-providers-apache-spark", "psycopg"):
        assert pkg in names, f"requirements.txt lacks {pkg} (needed by the Airflow image)"


def test_spark_cluster_runs_the_drivers_python_and_spark(services):
    """Driver (a task in an Airflow container) and executors (the Spark containers) run the same
    Python and Spark: the Spark services use the Airflow image itself, whose base tag names the
    driver's Python, and whose pyspark is the one requirements.txt pins (and the tests run)."""
    import sys
    from importlib.metadata import version

    airflow_image = {svc["image"] for svc in group(services, "airflow-").values()}
    assert len(airflow_image) == 1
    for name in ("spark-master", "spark-worker"):
        assert services[name]["image"] in airflow_image, f"{name} runs another image: {services[name]['image']}"
        assert tokens(services[name]["command"])[0] == "spark-class", f"{name}: the image's pyspark spark-class"
    base = re.search(
        r"^FROM apache/airflow:([\d.]+)-python(\d+\.\d+)", (ROOT / "docker/airflow.Dockerfile").read_text(), re.M
    )
    assert base, "docker/airflow.Dockerfile: FROM apache/airflow:<version>-python<X.Y>"
    assert base.group(2) == f"{sys.version_info.major}.{sys.version_info.minor}", (
        "the image's Python is not the driver's"
    )
    pins = dict(
        re.match(r"([\w.-]+)==([\w.]+)", ln).groups()
        for ln in (ROOT / "requirements.txt").read_text().splitlines()
        if re.match(r"[\w.-]+==", ln)
    )
    assert pins["pyspark"] == version("pyspark"), "requirements.txt's pyspark is not the one the tests run"
    assert base.group(1) == version("apache-airflow"), "the image's Airflow is not the one the tests run"
    assert services["spark-worker"]["environment"]["PYSPARK_PYTHON"].endswith("python")


def test_docker_compose_config():
    docker = shutil.which("docker")
    if not docker or subprocess.run([docker, "compose", "version"], capture_output=True).returncode:
        pytest.skip("docker CLI with the compose plugin not installed")
    run = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE), "config", "-q"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    if run.returncode and re.search(r"daemon|docker\.sock|permission denied", run.stderr, re.I):
        pytest.skip(f"docker compose config needs an engine here: {run.stderr.strip()}")
    assert run.returncode == 0, f"docker compose config failed: {run.stderr}"
