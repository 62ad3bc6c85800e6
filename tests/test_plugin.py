"""The shard pages: Airflow's plugin manager loads them; a real api-server serves them behind
Airflow's authentication (an anonymous browser is sent to Airflow's login page, any other
anonymous request gets 401 like /api/v2; no docs or schema routes); they show
frontiers, failure causes, drift with the foreign Delta versions behind it, charts and links to
runs; the ledger pages by key (10,000 batches, through an index, never a sort). A real browser logs in
and reads them in tests/test_pages_browser.py."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from helpers import api_server, make_sink, run_stages, write_json_rows

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "reconcile-test-pw"


def test_plugin_is_discovered_by_airflow():
    from airflow import plugins_manager

    info = {p["name"]: p for p in plugins_manager.get_plugin_info()}
    assert "reconcile" in info
    assert any(a.get("url_prefix") == "/reconcile" for a in info["reconcile"].get("fastapi_apps") or []), info


def _get(url: str, token: str | None = None, cookie: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if cookie:
        req.add_header("Cookie", f"_token={cookie}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture(scope="module")
def shard_pages(airflow_db, spark, tmp_path_factory):
    """An api-server (simple auth manager, user admin) over a sink with a committed batch, a
    drift-repairing batch and a failed append; yields (base url, token, tmp)."""
    from reconcile import failpoints
    from reconcile.errors import FailPointHit
    from reconcile.storage import frames
    from reconcile.storage.delta import ShardTable
    from reconcile.storage.ledger import Ledger

    tmp = tmp_path_factory.mktemp("pages")
    url = f"sqlite:///{tmp / 'meta.db'}"
    env = dict(RECONCILE_METADATA_URL=url, RECONCILE_SINKS_DIR=str(tmp), RECONCILE_WAREHOUSE=str(tmp / "wh"))
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        ledger = Ledger(url)
        cfg = make_sink(tmp, "paged", schedule="@hourly", alert={"lag_minutes": 5})
        make_sink(tmp, "fresh")  # valid, never run: no shard yet
        (tmp / "broken.yaml").write_text("kind: nope\n")
        write_json_rows(tmp / "src", [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}])
        run_stages(spark, ledger, cfg, "scheduled__2026-01-01T01:00:00+00:00", 200)
        foreign = spark.createDataFrame([(9, "zz", 150, 1, None)], frames.schema(cfg))
        foreign.write.format("delta").mode("append").save(ShardTable(cfg).path)  # drift, behind the sink's back
        run_stages(spark, ledger, cfg, "scheduled__2026-01-01T02:00:00+00:00", 300)
        failpoints.arm("append.before_delta_commit", "raise")
        try:
            from reconcile.airflow.tasks import commit_for_run
            from reconcile.sink import mint, write

            desc = mint.run_mint(ledger, cfg, "manual__failed", 1, 400).description
            write.run_write(spark, ledger, cfg, desc.batch_id)
            with pytest.raises(FailPointHit):
                commit_for_run(cfg.name, "manual__failed", desc.batch_id)
        finally:
            failpoints.disarm_all()
        ledger.dispose()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    with api_server(tmp, PASSWORD, env) as (base, token):
        yield base, token, tmp


@pytest.mark.airflow
def test_anonymous_requests_get_what_api_v2_gives_them(shard_pages):
    base, _, _ = shard_pages
    assert _get(f"{base}/api/v2/dags")[0] == 401
    for path in ("/reconcile/", "/reconcile/sinks/paged", "/reconcile/sinks/x", "/reconcile/sinks/paged?before=1"):
        status, body = _get(base + path)  # no Accept: text/html, an API client
        assert status == 401, (path, status, body[:200])
        assert "paged" not in body and "1970" not in body and "Not authenticated" in body
    for path in ("/reconcile/docs", "/reconcile/openapi.json", "/reconcile/redoc", "/reconcile/docs/oauth2-redirect"):
        status, body = _get(base + path)
        assert status in (401, 404) and "swagger" not in body.lower() and "openapi" not in body.lower(), path
    assert _get(f"{base}/reconcile/", token="not-a-token")[0] in (401, 403)
    assert _get(f"{base}/reconcile/", cookie="not-a-token")[0] in (401, 403)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # the redirect itself is the answer


def _navigate(url: str, accept: str, cookie: str | None = None) -> tuple[int, str | None, str]:
    """GET ``url`` as a browser navigating would (``Accept: <accept>``), without following a
    redirect: (status, Location, body)."""
    req = urllib.request.Request(url, headers={"Accept": accept})
    if cookie:
        req.add_header("Cookie", f"_token={cookie}")
    try:
        with urllib.request.build_opener(_NoRedirect).open(req, timeout=30) as r:
            return r.status, r.headers.get("Location"), r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Location"), exc.read().decode()


@pytest.mark.airflow
def test_a_browser_without_a_session_is_sent_to_airflows_login(shard_pages):
    """A request that accepts HTML (a browser navigating) without a valid session is redirected
    to the simple auth manager's login page with next= the page; an API client keeps 401 JSON."""
    import json
    from urllib.parse import urlencode

    base, token, _ = shard_pages
    html = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"  # what Chromium sends
    for path in ("/reconcile/", "/reconcile/sinks/paged", "/reconcile/sinks/paged?before=200"):
        status, location, body = _navigate(base + path, html)
        assert (status, location) == (307, "/auth/login?" + urlencode({"next": path})), (path, status, body[:200])
        assert "paged" not in body
    assert _navigate(f"{base}/reconcile/", html, cookie="not-a-token")[:2] == (307, "/auth/login?next=%2Freconcile%2F")
    status, _, page = _navigate(f"{base}/auth/login?next=%2Freconcile%2F", html)
    assert status == 200 and "<html" in page.lower()  # Airflow's own login page
    status, location, body = _navigate(f"{base}/reconcile/", "application/json")
    assert (status, location) == (401, None) and json.loads(body) == {"detail": "Not authenticated"}
    assert _navigate(f"{base}/reconcile/", html, cookie=token)[0] == 200  # a session: the page itself


@pytest.mark.airflow
def test_pages_show_frontiers_causes_drift_charts_and_links(shard_pages):
    base, token, _ = shard_pages
    status, page = _get(f"{base}/reconcile/", token=token)
    assert status == 200, page[:500]
    assert "paged" in page and "broken.yaml" in page  # invalid configs are listed, not hidden
    assert "fresh" in page and "no shard yet" in page
    assert "1970-01-01T00:00:00.300Z" in page and "(300)" in page  # upper, ISO with its ms
    assert "class=bad" in page and "alert past 0h 5m" in page  # lag past the sink's threshold
    assert "never compacted" in page
    assert "retryable: fail point append.before_delta_commit hit" in page  # the failed append's cause
    # needing action first, under the counts per state: the invalid file, the late sink, then the new one
    assert "<p id=counts><span class=bad>3 sink(s): 1 invalid, 1 late, 1 new</span></p>" in page
    table = page[page.index("<table>") :]
    assert table.index(">broken<") < table.index(">paged</a>") < table.index(">fresh</a>")
    assert "<span class='small nw'><span class=bad>late</span></span>" in table
    assert "<span class='small nw'><span class=done>new</span></span>" in table

    assert _get(f"{base}/reconcile/", cookie=token)[0] == 200  # the UI's cookie works too
    status, sink = _get(f"{base}/reconcile/sinks/paged", token=token)
    assert status == 200, sink[:500]
    assert sink.count("<svg") == 3
    assert "rows per batch" in sink and "upper at each commit" in sink and "lag at each commit" in sink
    run = "/dags/paged/runs/scheduled__2026-01-01T02%3A00%3A00%2B00%3A00"
    assert f"href='{run}'" in sink and f"href='{run}/tasks/append'" in sink and f"href='{run}/tasks/write'" in sink
    # the drift the second batch repaired, and the foreign Delta version behind it (not the sink's v1)
    assert "<span class=done>drift 1</span> (rows repaired at version 3)" in sink, sink  # grey: repaired
    assert "Delta v2: WRITE by <span class=nw>Apache-Spark" in sink
    assert "Delta v1:" not in sink
    assert "retryable: fail point append.before_delta_commit hit" in sink
    assert "1970-01-01T00:00:00.200Z</span> <span class='small nw'>(200)</span>" in sink  # every time with its ms
    assert _get(f"{base}/reconcile/sinks/nope", token=token)[0] == 404
    status, fresh = _get(f"{base}/reconcile/sinks/fresh", token=token)
    assert status == 200 and "no shard yet" in fresh


@pytest.mark.airflow
def test_the_ledger_pages_by_key_through_the_api_server(shard_pages):
    base, token, _ = shard_pages
    status, older = _get(f"{base}/reconcile/sinks/paged?before=200", token=token)
    assert status == 200, older[:500]
    assert "<svg" not in older and "newest batches" in older  # charts on the first page only
    assert "scheduled__2026-01-01T01:00:00+00:00" in older
    assert "scheduled__2026-01-01T02:00:00+00:00" not in older and "manual__failed" not in older
    assert _get(f"{base}/reconcile/sinks/paged?before=yesterday", token=token)[0] == 400


@pytest.mark.airflow
def test_the_nav_entry_is_in_airflows_plugin_list(shard_pages):
    """Airflow 3.1's UI builds its nav from /api/v2/plugins; the entry opens /plugin/reconcile,
    which frames /reconcile/ (the browser test follows it)."""
    import json

    base, token, _ = shard_pages
    status, body = _get(f"{base}/api/v2/plugins", token=token)
    assert status == 200, body[:300]
    views = [v for p in json.loads(body)["plugins"] if p["name"] == "reconcile" for v in p["external_views"]]
    assert len(views) == 1, views
    want = {"name": "Reconcile shards", "href": "/reconcile/", "destination": "nav", "url_route": "reconcile"}
    assert want.items() <= views[0].items(), views


def test_the_ledger_pages_through_its_keyset_index_with_10000_batches(tmp_path, sqlite_ledger, monkeypatch):
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from reconcile.airflow.ui import PAGE, render_sink
    from reconcile.storage.ledger_rows import Batch, Shard

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    monkeypatch.setenv("RECONCILE_WAREHOUSE", str(tmp_path / "wh"))
    cfg = make_sink(tmp_path, "big")
    t = datetime(2026, 1, 1, tzinfo=UTC)
    with sqlite_ledger.tx() as s:
        s.add(Shard(**Shard.initial(cfg.name, 100, at=t)))
        s.add_all(
            Batch(
                batch_id=f"{100 + 10 * i}-{i:016x}",
                shard=cfg.name,
                lower=100 + 10 * i,
                upper=110 + 10 * i,
                state="committed",
                run_id=f"scheduled__{i}",
                attempt=1,
                delta_version=i,
                rows_ok=i % 7,
                rows_err=0,
                drift_rows=0,
                created_at=t + timedelta(minutes=i),
                updated_at=t + timedelta(minutes=i),
            )
            for i in range(10_000)
        )
    with sqlite_ledger.tx() as s:
        s.get(Shard, cfg.name).upper = 100 + 10 * 10_000
    pages: list[tuple[str, object]] = []

    def grab(conn, cursor, statement, parameters, context, executemany):
        if "FROM reconcile_batches" in statement and "LIMIT" in statement and "DESC" in statement:
            pages.append((statement, parameters))

    event.listen(Engine, "before_cursor_execute", grab)
    try:
        first = render_sink(cfg.name)
        deep = render_sink(cfg.name, (100 + 10 * 5_000, f"{100 + 10 * 5_000}-{5_000:016x}"))
    finally:
        event.remove(Engine, "before_cursor_execute", grab)
    assert first.count("<tr>") == PAGE + 1 and "older batches" in first
    assert "scheduled__9999" in first and "scheduled__4999" in deep and "scheduled__5000" not in deep
    assert f"?before={100 + 10 * 9_950}:" in first  # the next page's key
    # each page is read through the keyset index, never by sorting the shard's batches (how long
    # a page takes is a benchmark's question: a wall-clock bound here failed on a busy machine)
    statement, parameters = pages[-1]
    with sqlite_ledger.engine.connect() as conn:
        plan = " ".join(str(r) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters).all())
    assert "ix_reconcile_batches_keyset" in plan and "TEMP B-TREE" not in plan, plan


def test_batch_page_and_previous_committed_on_both_databases(ledger):
    """Keyset pages newest first (several batches may share a lower) and the committed batch
    below a lower, on SQLite and PostgreSQL."""
    from reconcile.storage.ledger_rows import Batch, Shard

    t = datetime(2026, 1, 1, tzinfo=UTC)
    states = {"a": "superseded", "b": "committed", "c": "committed", "d": "minted", "e": "committed"}
    lowers = {"a": 10, "b": 10, "c": 20, "d": 30, "e": 30}
    with ledger.tx() as s:
        s.add(Shard(**Shard.initial("kp", 10, at=t)))
        s.add_all(
            Batch(
                batch_id=f"{lowers[k]}-{k}",
                shard="kp",
                lower=lowers[k],
                upper=lowers[k] + 10,
                state=state,
                attempt=1,
                created_at=t,
                updated_at=t,
            )  # fmt: skip
            for k, state in states.items()
        )
    ids = [b.batch_id for b in ledger.batch_page("kp", limit=10)]
    assert ids == ["30-e", "30-d", "20-c", "10-b", "10-a"]
    assert [b.batch_id for b in ledger.batch_page("kp", before=(30, "30-d"), limit=2)] == ["20-c", "10-b"]
    assert [b.batch_id for b in ledger.batch_page("kp", before=(30, ""), limit=10)] == ["20-c", "10-b", "10-a"]
    assert ledger.last_batch("kp").batch_id == "30-e"
    assert ledger.previous_committed("kp", 30).batch_id == "20-c"
    assert ledger.previous_committed("kp", 20).batch_id == "10-b"
    assert ledger.previous_committed("kp", 10) is None
