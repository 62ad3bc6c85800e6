"""The shard pages in a real browser: headless Chromium (Debian's package, /usr/bin/chromium)
driven by playwright logs in through Airflow's own login page, then reads the overview, a sink
page and the "Reconcile shards" entry of Airflow's UI, which frames the overview.

CI installs chromium (.ci/run); without it this test fails there (CI=true) and skips, saying
why, elsewhere."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from helpers import api_server, make_sink

CHROMIUM = Path("/usr/bin/chromium")
PASSWORD = "reconcile-browser-pw"
HOUR = 3_600_000
T0 = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)


def _need_browser():
    """playwright and Debian's chromium, or a clear failure on CI (a skip, saying why, elsewhere)."""
    problem = None
    if not CHROMIUM.exists():
        problem = f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            problem = "playwright is not installed: scripts/setup.sh installs requirements-lock.txt"
    if problem:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"the browser test cannot run on CI: {problem}")
        pytest.skip(problem)


@pytest.fixture(scope="module")
def pages(airflow_db, tmp_path_factory):
    """An api-server over a ledger written directly (no Spark): sink ``orders`` with three
    committed hourly batches (one repaired drift) and a failed fourth."""
    from reconcile.storage.ledger import Ledger
    from reconcile.storage.tables import Batch, Shard

    tmp = tmp_path_factory.mktemp("browser")
    url = f"sqlite:///{tmp / 'meta.db'}"
    cfg = make_sink(tmp, "orders", schedule="@hourly")
    store = Ledger(url)
    at = datetime(2026, 1, 1, tzinfo=UTC)
    with store.tx() as s:
        s.add(Shard(**{**Shard.initial(cfg.name, T0, at=at), "upper": T0 + 3 * HOUR, "delta_version": 3}))
        for i in range(4):
            failed = i == 3
            s.add(
                Batch(
                    batch_id=f"{T0 + i * HOUR}-{i:016x}",
                    shard=cfg.name,
                    lower=T0 + i * HOUR,
                    upper=T0 + (i + 1) * HOUR,
                    state="staged" if failed else "committed",
                    run_id=f"scheduled__2026-01-01T0{i + 1}:00:00+00:00",
                    attempt=1,
                    delta_version=None if failed else i + 1,
                    rows_ok=10 * (i + 1),
                    rows_err=1 if i == 1 else 0,
                    drift_rows=2 if i == 2 else 0,
                    message="source src: path /data/orders does not exist" if failed else None,
                    failure_kind="final" if failed else None,
                    created_at=at + timedelta(hours=i + 1),
                    updated_at=at + timedelta(hours=i + 1, minutes=5),
                )
            )
        s.add(  # the scheduled catch-up run a backfill's batch superseded: green, yet the shard is behind it
            Batch(
                batch_id=f"{T0 + 3 * HOUR}-0000000000000000c",
                shard=cfg.name,
                lower=T0 + 3 * HOUR,
                upper=T0 + 5 * HOUR,
                state="superseded",
                run_id="scheduled__catchup",
                attempt=1,
                message="superseded by batch x of run y Remedy: none needed: the next scheduled run appends it",
                failure_kind="final",
                created_at=at + timedelta(hours=3, minutes=30),
                updated_at=at + timedelta(hours=3, minutes=40),
            )
        )
    store.dispose()
    env = dict(RECONCILE_METADATA_URL=url, RECONCILE_SINKS_DIR=str(tmp), RECONCILE_WAREHOUSE=str(tmp / "wh"))
    with api_server(tmp, PASSWORD, env) as (base, _):
        yield base, tmp


@pytest.mark.airflow
def test_a_browser_logs_in_and_reads_the_pages(pages):
    _need_browser()
    from playwright.sync_api import sync_playwright

    base, tmp = pages
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page()
            response = page.goto(f"{base}/reconcile/")
            assert response is not None and response.status == 401  # no login yet: closed
            assert "orders" not in page.content()

            page.goto(f"{base}/auth/login")
            page.get_by_label("Username").fill("admin")
            page.get_by_label("Password").fill(PASSWORD)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(lambda url: "/auth/login" not in url, timeout=30_000)
            assert any(c["name"] == "_token" for c in page.context.cookies())  # the UI's JWT cookie

            response = page.goto(f"{base}/reconcile/")
            assert response is not None and response.status == 200
            assert page.get_by_role("heading", name="Reconcile shards").is_visible()
            row = page.locator("tr", has=page.get_by_role("link", name="orders"))
            text = row.inner_text()
            assert "2026-01-01T03:00:00.000Z" in text and f"({T0 + 3 * HOUR})" in text  # upper, with its ms
            assert "never compacted" in text
            assert "final: source src: path /data/orders does not exist" in text  # the last batch's cause
            assert row.locator(".bad").count() >= 1  # lagging well past twice the hourly schedule

            row.get_by_role("link", name="orders").click()
            page.wait_for_url("**/reconcile/sinks/orders")
            assert page.get_by_role("heading", name="orders").is_visible()
            assert page.locator("svg").count() == 3
            assert page.locator("svg polyline").count() == 2 and page.locator("svg rect").count() >= 3
            assert page.get_by_text("drift 2", exact=True).is_visible()
            # the superseded run is grey, not a red "final: ... Remedy: none needed"; the run to clear is named
            grey = page.locator(".done", has_text="superseded by batch x of run y")
            assert grey.count() >= 1 and "Remedy" not in grey.first.inner_text()
            assert page.locator(".bad", has_text="superseded").count() == 0
            behind = page.locator("p.warn")
            assert "airflow dags clear orders --run-id scheduled__catchup -y" in behind.inner_text()
            run = page.get_by_role("link", name="run", exact=True).first
            assert run.get_attribute("href") == "/dags/orders/runs/scheduled__2026-01-01T04%3A00%3A00%2B00%3A00"
            log = page.get_by_role("link", name="append log").first
            assert log.get_attribute("href") == (
                "/dags/orders/runs/scheduled__2026-01-01T04%3A00%3A00%2B00%3A00/tasks/append"
            )
            page.screenshot(path=str(tmp / "sink-page.png"), full_page=True)

            # the nav entry: Airflow's UI route for the plugin frames the overview
            page.goto(f"{base}/plugin/reconcile")
            frame = page.frame_locator("iframe[title='Reconcile shards']")
            frame.get_by_role("heading", name="Reconcile shards").wait_for(timeout=30_000)
            assert frame.get_by_role("link", name="orders").is_visible()
            page.screenshot(path=str(tmp / "nav-entry.png"))
        finally:
            browser.close()
