"""Airflow plugin: the "Reconcile shards" pages (every sink's frontiers, lag, batches, drift).

Served by Airflow 3's api-server under /reconcile/, behind Airflow's own authentication: the
user comes from the JWT the UI holds (its cookie, or an ``Authorization: Bearer`` header). A
browser without a valid session (a request that accepts ``text/html`` and sends no Bearer
header) is redirected (307) to the auth manager's login page with ``next=`` back to the page it
asked for; any other anonymous request gets 401 JSON as /api/v2 gives it. Each sink shows only
to users who may read its DAG. No docs or schema routes. Nothing runs at import beyond building the FastAPI app.
"""

from __future__ import annotations

from typing import Annotated, Any

from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse


class LoginRequired(Exception):
    """A browser without a valid session asked for a page: it is sent to ``login_url``."""

    def __init__(self, login_url: str):
        super().__init__(login_url)
        self.login_url = login_url


def _browser(request: Request, bearer) -> bool:
    """A browser navigating (it accepts HTML) rather than an API client (JSON, or a Bearer token)."""
    return bearer is None and "text/html" in request.headers.get("accept", "").lower()


def login_url(request: Request) -> str:
    """Airflow's login page (the configured auth manager's ``get_url_login``) with ``next=`` the
    page asked for, as a path on this server (the login page only follows same-origin URLs)."""
    from airflow.api_fastapi.app import get_auth_manager

    back = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return get_auth_manager().get_url_login(next_url=back)


async def current_user(request: Request):
    """The caller as Airflow's auth manager knows it, by Airflow's own dependency
    (``airflow.api_fastapi.core_api.security.get_user``: the JWT of an ``Authorization: Bearer``
    header, else the user Airflow's JWT refresh middleware resolved, else the JWT of the UI's
    ``_token`` cookie); 401 when there is none, as /api/v2 answers. Imported per request: the
    plugin loads in every Airflow process, the api-server has it imported already. Its
    parameters are bound by name (Airflow 3.1 calls the OAuth2 one ``oauth_token``, 3.3
    ``_oauth_token``; both read the same Bearer header). A browser whose session is missing,
    expired (401) or not a valid JWT (403) is sent to the login page instead."""
    import inspect

    from airflow.api_fastapi.core_api.security import get_user
    from fastapi.security import HTTPAuthorizationCredentials

    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    bearer = (
        HTTPAuthorizationCredentials(scheme=scheme, credentials=credentials.strip())
        if scheme.lower() == "bearer" and credentials.strip()
        else None
    )
    given = {"request": request, "bearer_credentials": bearer}
    bound: dict[str, Any] = {name: given.get(name) for name in inspect.signature(get_user).parameters}
    try:
        return await get_user(**bound)
    except HTTPException as exc:
        if exc.status_code in (401, 403) and _browser(request, bearer):
            raise LoginRequired(login_url(request)) from None
        raise


def _reader(user):
    """Can ``user`` read the DAG of sink ``name``? (Airflow's auth manager decides.)"""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

    manager = get_auth_manager()
    return lambda name: manager.is_authorized_dag(method="GET", user=user, details=DagDetails(id=name))


User = Annotated[Any, Depends(current_user)]
app = FastAPI(title="Reconcile shards", docs_url=None, redoc_url=None, openapi_url=None)


@app.exception_handler(LoginRequired)
async def _to_login(request: Request, exc: LoginRequired) -> RedirectResponse:
    return RedirectResponse(exc.login_url, status_code=307)


@app.get("/", response_class=HTMLResponse)
def overview(user: User) -> str:
    from reconcile.airflow.ui import render_overview

    return render_overview(_reader(user))


@app.get("/sinks/{name}", response_class=HTMLResponse)
def sink(name: str, user: User, before: str | None = None) -> str:
    """``?before=<lower>:<batch id>``: the ledger page of the batches older than that key."""
    from reconcile.airflow.ui import render_sink
    from reconcile.errors import SinkError

    if not _reader(user)(name):
        raise HTTPException(status_code=403, detail=f"you may not read the DAG {name}")
    key = None
    if before:
        lower, _, batch_id = before.partition(":")
        if not lower.lstrip("-").isdigit():
            raise HTTPException(status_code=400, detail="before must be <lower>[:<batch id>]")
        key = (int(lower), batch_id)  # no batch id: every batch below lower ("" sorts first)
    try:
        return render_sink(name, key)
    except SinkError as exc:
        raise HTTPException(status_code=404, detail=str(exc)) from None


class ReconcilePlugin(AirflowPlugin):
    name = "reconcile"
    fastapi_apps = [{"app": app, "url_prefix": "/reconcile", "name": "Reconcile shards"}]
    external_views = [
        {"name": "Reconcile shards", "href": "/reconcile/", "destination": "nav", "url_route": "reconcile"}
    ]
