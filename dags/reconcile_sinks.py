"""Reconcile sinks: one DAG per config file in include/sinks/ (or RECONCILE_SINKS_DIR).

Each DAG is ``mint >> write >> append`` (see include/reconcile/airflow/dags.py). This file only
wires DAGs from the config files: nothing expensive runs at parse time.
"""

from reconcile.airflow.dags import build_dags

globals().update(build_dags())
