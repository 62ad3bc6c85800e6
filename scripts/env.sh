# Environment of the embedded default (local Spark, local Delta folder, SQLite). Source it:
#   . scripts/env.sh
# Every variable can be set beforehand to point elsewhere (production: see docker-compose.yaml); a
# value already set (not empty) is kept as it is, however often this is sourced.
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export RECONCILE_HOME="${RECONCILE_HOME:-$_root/.reconcile}"
export AIRFLOW_HOME="${AIRFLOW_HOME:-$RECONCILE_HOME/airflow}"
export AIRFLOW__CORE__DAGS_FOLDER="${AIRFLOW__CORE__DAGS_FOLDER:-$_root/dags}"
export AIRFLOW__CORE__PLUGINS_FOLDER="${AIRFLOW__CORE__PLUGINS_FOLDER:-$_root/plugins}"
export AIRFLOW__CORE__LOAD_EXAMPLES="${AIRFLOW__CORE__LOAD_EXAMPLES:-False}"
export AIRFLOW__CORE__UNIT_TEST_MODE="${AIRFLOW__CORE__UNIT_TEST_MODE:-False}"
export AIRFLOW__LOGGING__LOGGING_LEVEL="${AIRFLOW__LOGGING__LOGGING_LEVEL:-INFO}"
# The scheduler's workers reach the api-server here (set AIRFLOW_PORT when 8080 is taken).
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="${AIRFLOW__CORE__EXECUTION_API_SERVER_URL:-http://127.0.0.1:${AIRFLOW_PORT:-8080}/execution/}"
# Airflow on SQLite waits up to 60 s for a lock (sqlite3's 5 s is too short while the scheduler,
# the dag-processor and a CLI command write at once).
case "${AIRFLOW__DATABASE__SQL_ALCHEMY_CONN:-sqlite}" in
  sqlite*) export AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS="${AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS:-reconcile.settings.AIRFLOW_SQLITE_CONNECT_ARGS}" ;;
esac
# A default holding a brace is a variable of its own: inside ${VAR:-...} its first `}` would end
# the expansion and append a stray `}` to a value already set (tests/test_scripts.py).
_spark='{"conn_type": "spark", "host": "local[2]"}'
export AIRFLOW_CONN_SPARK_DEFAULT="${AIRFLOW_CONN_SPARK_DEFAULT:-$_spark}"
# Put first once: sourcing again leaves PATH and PYTHONPATH as they are.
case "$PATH" in "$_root/.venv/bin:"*) ;; *) export PATH="$_root/.venv/bin:$PATH" ;; esac
export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$_root/.venv/bin/python}"
case "${PYTHONPATH:-}" in "$_root/include" | "$_root/include:"*) ;; *) export PYTHONPATH="$_root/include${PYTHONPATH:+:$PYTHONPATH}" ;; esac
mkdir -p "$RECONCILE_HOME" "$AIRFLOW_HOME"
unset _root _spark
