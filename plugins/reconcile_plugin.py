"""Airflow plugin: a "Reconcile shards" page (frontiers, lag, last batches of every sink).

Served by Airflow 3's api-server under /reconcile/ and linked from the UI's navigation.
Nothing runs at import beyond building the (empty) FastAPI app.
"""

from airflow.plugins_manager import AirflowPlugin
from fastapi import FastAPI
from fastapi.responses import HTMLResponse

app = FastAPI(title="Reconcile shards")


@app.get("/", response_class=HTMLResponse)
def overview() -> str:
    from reconcile.airflow.ui import render_overview

    return render_overview()


class ReconcilePlugin(AirflowPlugin):
    name = "reconcile"
    fastapi_apps = [{"app": app, "url_prefix": "/reconcile", "name": "Reconcile shards"}]
    external_views = [
        {"name": "Reconcile shards", "href": "/reconcile/", "destination": "nav", "url_route": "reconcile"}
    ]
