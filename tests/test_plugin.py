"""The shard pages: Airflow's plugin manager loads them; a real api-server serves them behind
Airflow's authentication (anonymous: 401 like /api/v2; no docs or schema routes); they show
frontiers, failure causes, drift with the foreign Delta versions behind it, charts and links to
runs; 10,000 batches page fast; a real browser logs in and reads them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from helpers import make_sink, run_batch, write_json_rows

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "reconcile-test-pw"


def test_plugin_is_discovered_by_airflow():
    from airflow import plugins_manager

    info = {p["name"]: p for p in plugins_manager.get_plugin_info()}
    assert "reconcile" in info
    assert any(a.get("url_prefix") == "/reconcile" for a in info["reconcile"].get("fastapi_apps") or []), info


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    except urllib.error.URLError:  # not listening (yet)
        return 0, ""


@pytest.fixture(scope="module")
def shard_pages(airflow_db, spark, tmp_path_factory):
    """An api-server (simple auth manager, user admin) over a sink with a committed batch, a
    drift-repairing batch and a failed append; yields (base url, token, tmp)."""
    from reconcile import failpoints
    from reconcile.errors import FailPointHit
    from reconcile.storage import delta as storage
    from reconcile.storage import frames
    from reconcile.storage.ledger import MetadataStore

    tmp = tmp_path_factory.mktemp("pages")
    url = f"sqlite:///{tmp / 'meta.db'}"
    saved = {k: os.environ.get(k) for k in ("RECONCILE_METADATA_URL", "RECONCILE_SINKS_DIR", "RECONCILE_WAREHOUSE")}
    os.environ.update(RECONCILE_METADATA_URL=url, RECONCILE_SINKS_DIR=str(tmp), RECONCILE_WAREHOUSE=str(tmp / "wh"))
    store = MetadataStore(url)
    cfg = make_sink(tmp, "paged", schedule="@hourly", alert={"lag_minutes": 5})
    (tmp / "broken.yaml").write_text("kind: nope\n")
    write_json_rows(tmp / "src", [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}])
    run_batch(spark, store, cfg, "scheduled__2026-01-01T01:00:00+00:00", 200)
    foreign = spark.createDataFrame([(9, "zz", 150, 1, None)], frames.schema(cfg))
    foreign.write.format("delta").mode("append").save(storage.table_path(cfg))  # drift, behind the sink's back
    run_batch(spark, store, cfg, "scheduled__2026-01-01T02:00:00+00:00", 300)
    failpoints.arm("append.before_delta_commit", "raise")
    try:
        from reconcile.airflow.tasks import commit_for_run
        from reconcile.sink import mint, write

        desc = mint.run_mint(store, cfg, "manual__failed", 1, 400).description
        write.run_write(spark, store, cfg, desc.batch_id)
        with pytest.raises(FailPointHit):
            commit_for_run(cfg.name, "manual__failed", desc.batch_id)
    finally:
        failpoints.disarm_all()
    store.dispose()

    port = _free_port()
    (tmp / "passwords.json").write_text(json.dumps({"admin": PASSWORD}))
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_GATEWAY_PORT"}
    env.update(
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(tmp / "passwords.json"),
        AIRFLOW__API_AUTH__JWT_SECRET="reconcile-pages-test",
        AIRFLOW__API__SECRET_KEY="reconcile-pages-test",
    )
    log = open(tmp / "api-server.log", "w")
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "airflow"), "api-server", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while _get(f"{base}/api/v2/monitor/health")[0] != 200:
            assert server.poll() is None and time.time() < deadline, (tmp / "api-server.log").read_text()[-3000:]
            time.sleep(1)
        req = urllib.request.Request(
            f"{base}/auth/token",
            data=json.dumps({"username": "admin", "password": PASSWORD}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            token = json.load(r)["access_token"]
        yield base, token, tmp
    finally:
        server.terminate()
        server.wait(timeout=30)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.mark.airflow
def test_anonymous_requests_get_what_api_v2_gives_them(shard_pages):
    base, _, _ = shard_pages
    assert _get(f"{base}/api/v2/dags")[0] == 401
    for path in ("/reconcile/", "/reconcile/sinks/paged"):
        status, body = _get(base + path)
        assert status == 401, (path, status, body[:200])
        assert "paged" not in body
    for path in ("/reconcile/docs", "/reconcile/openapi.json", "/reconcile/redoc"):
        assert _get(base + path)[0] in (401, 404), path
    assert _get(f"{base}/reconcile/", token="not-a-token")[0] in (401, 403)


@pytest.mark.airflow
def test_pages_show_frontiers_causes_drift_charts_and_links(shard_pages):
    base, token, _ = shard_pages
    status, page = _get(f"{base}/reconcile/", token=token)
    assert status == 200, page[:500]
    assert "paged" in page and "broken.yaml" in page  # invalid configs are listed, not hidden
    assert "1970-01-01T00:00:00.300Z" in page and "(300)" in page  # upper, ISO with its ms
    assert "class=bad" in page and "alert past 0h 5m" in page  # lag past the sink's threshold
    assert "never compacted" in page
    assert "fail point append.before_delta_commit hit" in page  # the failed append's cause

    assert _get(f"{base}/reconcile/", cookie=token)[0] == 200  # the UI's cookie works too
    status, sink = _get(f"{base}/reconcile/sinks/paged", token=token)
    assert status == 200, sink[:500]
    assert (
        sink.count("<svg") == 3
        and "rows per batch" in sink
        and "upper at each commit" in sink
        and "lag at each" in sink
    )
    assert "/dags/paged/runs/scheduled__2026-01-01T02%3A00%3A00%2B00%3A00/tasks/append" in sink
    assert "drift 1" in sink and "Delta v2: WRITE by Apache-Spark" in sink  # the foreign version behind it
    assert "retryable: fail point append.before_delta_commit hit" in sink
    assert _get(f"{base}/reconcile/sinks/nope", token=token)[0] == 404


def test_the_ledger_pages_fast_with_10000_batches(tmp_path, sqlite_store, monkeypatch):
    from reconcile.airflow.ui import PAGE, render_sink
    from reconcile.storage.tables import Batch, Shard

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    monkeypatch.setenv("RECONCILE_WAREHOUSE", str(tmp_path / "wh"))
    cfg = make_sink(tmp_path, "big")
    t = datetime(2026, 1, 1, tzinfo=UTC)
    with sqlite_store.tx() as s:
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
    with sqlite_store.tx() as s:
        s.get(Shard, cfg.name).upper = 100 + 10 * 10_000
    t0 = time.perf_counter()
    first = render_sink(cfg.name)
    t1 = time.perf_counter()
    deep = render_sink(cfg.name, (100 + 10 * 5_000, f"{100 + 10 * 5_000}-{5_000:016x}"))
    t2 = time.perf_counter()
    assert first.count("<tr>") == PAGE + 1 and "older batches" in first
    assert "scheduled__9999" in first and "scheduled__4999" in deep and "scheduled__5000" not in deep
    assert t1 - t0 < 1.0 and t2 - t1 < 1.0, (t1 - t0, t2 - t1)


@pytest.mark.airflow
def test_a_browser_logs_in_and_reads_the_pages(shard_pages):
    """Headless Chromium (Debian's package) through playwright: Airflow's login page, then the
    shard overview and a sink page."""
    if not Path("/usr/bin/chromium").exists():
        message = "/usr/bin/chromium is missing: apt-get install -y chromium (.ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    base, _, tmp = shard_pages
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(f"{base}/reconcile/")
        assert "Not authenticated" in page.content()  # no login yet: the pages are closed
        page.goto(f"{base}/auth/login")
        page.get_by_label("Username").fill("admin")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(lambda url: "/auth/login" not in url, timeout=30_000)
        page.goto(f"{base}/reconcile/")
        assert page.get_by_role("heading", name="Reconcile shards").is_visible()
        assert "fail point append.before_delta_commit hit" in page.content()
        page.get_by_role("link", name="paged").click()
        page.wait_for_url("**/reconcile/sinks/paged")
        assert page.locator("svg").count() == 3
        assert page.get_by_role("link", name="append log").first.get_attribute("href").startswith("/dags/paged/runs/")
        page.screenshot(path=str(tmp / "sink-page.png"))
        browser.close()
