"""Object-store credentials from an Airflow AWS connection (``RECONCILE_AWS_CONN_ID``): put into
the task's environment as the standard AWS variables, which delta-rs, Arrow's S3 client, S3A
and a spark-submit child all read. Airflow masks the connection's password in task logs; the
sink never writes a credential anywhere (not in conf, options, the ledger or its output)."""

from __future__ import annotations

import os


def export_connection(conn_id: str | None = None) -> bool:
    """Export the connection's credentials, region and endpoint into ``os.environ`` (variables
    already set by the deployment win). False when no connection is configured."""
    conn_id = conn_id or os.environ.get("RECONCILE_AWS_CONN_ID")
    if not conn_id:
        return False
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    extra = conn.extra_dejson or {}
    s3_config = (extra.get("service_config") or {}).get("s3") or {}
    values = {
        "AWS_ACCESS_KEY_ID": conn.login or extra.get("aws_access_key_id"),
        "AWS_SECRET_ACCESS_KEY": conn.password or extra.get("aws_secret_access_key"),
        "AWS_SESSION_TOKEN": extra.get("aws_session_token"),
        "AWS_REGION": extra.get("region_name"),
        "AWS_ENDPOINT_URL": s3_config.get("endpoint_url") or extra.get("endpoint_url"),
    }
    for name, value in values.items():
        if value and not os.environ.get(name):
            os.environ[name] = str(value)
    return True
