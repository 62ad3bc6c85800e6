"""Airflow: one DAG per sink config (``dags``), the tasks' plain functions (``tasks``), the UI (``ui``)."""
