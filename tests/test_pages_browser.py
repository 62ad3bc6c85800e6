"""The shard pages in a real browser: headless Chromium (Debian's package, /usr/bin/chromium)
driven by playwright, against a real api-server over a realistic history (two days of hourly
batches: a zero-row batch, a one-row drift next to a million-row batch, a failed-then-resolved
batch, a late commit, an unresolved failure, a superseded catch-up run).

- A browser without a session asking for a page is sent to Airflow's login page and, logged
  in, lands on the page it asked for (the simple auth manager's login follows ``next=``).
- Logged in, it reads the overview, a sink page and the "Reconcile shards" entry of Airflow's
  UI, which frames the overview.
- At 1280 and 800 px wide, the overview and the sink page are screenshotted (``<pytest tmp>/
  browser0/{overview,sink}-{1280,800}.png``) and their text is measured in the browser: no two
  visible text boxes intersect, no text leaves its chart, its scrolling box or the viewport, the
  charts' axes read UTC dates, no number is in exponent notation; with a 401-character failure
  message around a long path, no column is squeezed, no time, number or id breaks inside itself,
  the whole message is in its cell, and a table wider than the window scrolls in its own box.
- Foreign Delta versions written by delta-rs (a sink run by Spark) are red above the sink's
  charts and ledger and marked on the overview until the next batch repairs them; then they are
  grey on that batch's row (``drift-{before,after}-800.png``).

CI installs chromium (.ci/run); without it this test fails there (CI=true) and skips, saying
why, elsewhere."""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from helpers import api_server, make_sink, run_stages, shard_as_of, write_json_rows

CHROMIUM = Path("/usr/bin/chromium")
PASSWORD = "reconcile-browser-pw"
HOUR = 3_600_000
T0 = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
BATCHES = 48  # hourly, 2026-01-01T00 .. 2026-01-03T00; the last one fails
EMPTY, HUGE, DRIFT, RESOLVED, LATE, ERRORS = 30, 20, 21, 35, 12, 8  # batch numbers with a story
LONG_MESSAGE = (  # the last batch's failure: 401 characters around a long path with no break in it
    "source src: [PATH_NOT_FOUND] Path does not exist: file:/data/warehouse/landing/orders/region=emea/"
    "year=2026/month=01/day=01/a_really_long_directory_name_without_any_place_to_break_it_"
    "part-00000-cafdbdfa-abcd-4c2a-a0b1-c3d4f5a6b7c8-c000.snappy.parquet. Remedy: make the path readable, "
    "or fix the source's path in orders.yaml (sources.src.path); then clear the failed tasks of this run in the Airflow UI"
)


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


def _history(url: str, name: str) -> None:
    """Sink ``name``'s ledger, written directly (no Spark): :data:`BATCHES` hourly batches, each
    committed 5 minutes after its upper (batch LATE 3 hours after), the last one failed; batch
    EMPTY changed nothing, HUGE wrote a million rows, DRIFT repaired one row of drift, RESOLVED
    committed after a failed attempt, ERRORS holds error rows; and a superseded catch-up run."""
    from reconcile.storage.ledger import Ledger
    from reconcile.storage.ledger_rows import Batch, Shard

    ledger = Ledger(url)
    at = datetime(2026, 1, 1, tzinfo=UTC)
    last = BATCHES - 1
    with ledger.tx() as s:
        s.add(Shard(**{**Shard.initial(name, T0, at=at), "upper": T0 + last * HOUR, "delta_version": last}))
        for i in range(BATCHES):
            failed, resolved = i == last, i == RESOLVED
            upper = at + timedelta(hours=i + 1)
            s.add(
                Batch(
                    batch_id=f"{T0 + i * HOUR}-{i:016x}",
                    shard=name,
                    lower=T0 + i * HOUR,
                    upper=T0 + (i + 1) * HOUR,
                    state="staged" if failed else "committed",
                    run_id=f"scheduled__{upper:%Y-%m-%dT%H}:00:00+00:00",
                    attempt=2 if resolved else 1,
                    delta_version=None if failed else i + 1,
                    rows_ok={EMPTY: 0, HUGE: 1_000_000}.get(i, 300 + 17 * (i % 9)),
                    rows_err=3 if i == ERRORS else 0,
                    drift_rows=1 if i == DRIFT else 0,
                    message=(
                        LONG_MESSAGE  # the page wraps it inside its cell, the other columns keep their width
                        if failed
                        else "the api-server was restarted mid-commit"
                        if resolved
                        else None
                    ),
                    failure_kind="final" if failed else "retryable" if resolved else None,
                    created_at=upper,
                    updated_at=upper + timedelta(hours=3 if i == LATE else 0, minutes=5),
                )
            )
        s.add(  # the scheduled catch-up run a backfill's batch superseded: green, yet the shard is behind it
            Batch(
                batch_id=f"{T0 + last * HOUR}-0000000000000000c",
                shard=name,
                lower=T0 + last * HOUR,
                upper=T0 + (last + 2) * HOUR,
                state="superseded",
                run_id="scheduled__catchup",
                attempt=1,
                message="superseded by batch x of run y Remedy: none needed: the next scheduled run appends it",
                failure_kind="final",
                created_at=at + timedelta(hours=last, minutes=30),
                updated_at=at + timedelta(hours=last, minutes=40),
            )
        )
    ledger.dispose()


@pytest.fixture(scope="module")
def pages(airflow_db, tmp_path_factory):
    """An api-server over sink ``orders`` with :func:`_history`; yields (base url, tmp)."""
    tmp = tmp_path_factory.mktemp("browser")
    url = f"sqlite:///{tmp / 'meta.db'}"
    cfg = make_sink(tmp, "orders", schedule="@hourly")
    _history(url, cfg.name)
    env = dict(RECONCILE_METADATA_URL=url, RECONCILE_SINKS_DIR=str(tmp), RECONCILE_WAREHOUSE=str(tmp / "wh"))
    with api_server(tmp, PASSWORD, env) as (base, _):
        yield base, tmp


@contextmanager
def _chromium():
    _need_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


def _sign_in(page) -> None:
    """Fill in and submit Airflow's own login page (the simple auth manager's), already open."""
    page.get_by_label("Username").fill("admin")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "/auth/login" not in url, timeout=30_000)


@pytest.mark.airflow
def test_a_browser_without_a_session_is_sent_to_airflows_login_and_back(pages):
    base, _ = pages
    with _chromium() as browser:
        page = browser.new_page()
        response = page.goto(f"{base}/reconcile/sinks/orders?before={T0 + 10 * HOUR}")
        assert response is not None and response.ok
        assert urlparse(page.url).path == "/auth/login", page.url  # Airflow's login page, not a 401
        assert parse_qs(urlparse(page.url).query)["next"] == [f"/reconcile/sinks/orders?before={T0 + 10 * HOUR}"]
        first = response.request.redirected_from
        assert first is not None and first.response().status == 307
        assert page.get_by_role("button", name="Sign in").is_visible()
        _sign_in(page)
        page.wait_for_url(f"**/reconcile/sinks/orders?before={T0 + 10 * HOUR}", timeout=30_000)
        assert page.get_by_role("heading", name="orders").is_visible()  # back on the page it asked for
        assert page.get_by_text("newest batches").is_visible()
        assert any(c["name"] == "_token" for c in page.context.cookies())  # the UI's JWT cookie


@pytest.mark.airflow
def test_a_browser_logs_in_and_reads_the_pages(pages):
    base, tmp = pages
    with _chromium() as browser:
        page = browser.new_page()
        page.goto(f"{base}/auth/login")
        _sign_in(page)

        response = page.goto(f"{base}/reconcile/")
        assert response is not None and response.status == 200
        assert page.get_by_role("heading", name="Reconcile shards").is_visible()
        row = page.locator("tr", has=page.get_by_role("link", name="orders"))
        text = row.inner_text()
        upper = T0 + (BATCHES - 1) * HOUR
        assert "2026-01-02T23:00:00.000Z" in text and f"({upper})" in text  # upper, with its ms
        assert "never compacted" in text
        assert "final: source src: [PATH_NOT_FOUND] Path does not exist: file:/data/warehouse/" in text  # its cause
        assert row.locator(".bad").count() >= 1  # lagging well past twice the hourly schedule

        row.get_by_role("link", name="orders").click()
        page.wait_for_url("**/reconcile/sinks/orders")
        assert page.get_by_role("heading", name="orders").is_visible()
        assert page.locator("svg").count() == 3
        assert page.locator("svg polyline").count() == 2 and page.locator("svg rect").count() >= BATCHES - 2
        assert page.get_by_text("drift 1", exact=True).is_visible()
        resolved = page.locator(".done", has_text="resolved (a later attempt committed it at Delta version 36)")
        assert "retryable: the api-server was restarted mid-commit" in resolved.inner_text()
        # the superseded run is grey, not a red "final: ... Remedy: none needed"; the run to clear is named
        grey = page.locator(".done", has_text="superseded by batch x of run y")
        assert grey.count() >= 1 and "Remedy" not in grey.first.inner_text()
        assert page.locator(".bad", has_text="superseded").count() == 0
        behind = page.locator("p.warn")
        assert "airflow dags clear orders --run-id scheduled__catchup -y" in behind.inner_text()
        run = page.get_by_role("link", name="run", exact=True).first
        assert run.get_attribute("href") == "/dags/orders/runs/scheduled__2026-01-03T00%3A00%3A00%2B00%3A00"
        log = page.get_by_role("link", name="append log").first
        assert (
            log.get_attribute("href") == "/dags/orders/runs/scheduled__2026-01-03T00%3A00%3A00%2B00%3A00/tasks/append"
        )

        # the nav entry: Airflow's UI route for the plugin frames the overview
        page.goto(f"{base}/plugin/reconcile")
        frame = page.frame_locator("iframe[title='Reconcile shards']")
        frame.get_by_role("heading", name="Reconcile shards").wait_for(timeout=30_000)
        assert frame.get_by_role("link", name="orders").is_visible()
        page.screenshot(path=str(tmp / "nav-entry.png"))


TEXT_BOXES = """() => {
  const out = [];
  const visible = (el) => {
    const s = getComputedStyle(el);
    return s.visibility !== 'hidden' && s.display !== 'none' && Number(s.opacity) > 0;
  };
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode, el = node.parentElement;
    if (!node.textContent.trim() || el.closest('svg') || !visible(el)) continue;
    const range = document.createRange(), wide = el.closest('.wide');  // a box that scrolls sideways
    range.selectNodeContents(node);
    let box = null;
    if (wide) {
      const left = wide.getBoundingClientRect().left - wide.scrollLeft;
      box = {l: left, r: left + wide.scrollWidth};
    }
    for (const r of range.getClientRects()) {
      if (r.width > 0 && r.height > 0)
        out.push({text: node.textContent.trim().slice(0, 60), l: r.left, r: r.right, t: r.top, b: r.bottom, box});
    }
  }
  for (const t of document.querySelectorAll('svg text')) {
    const r = t.getBoundingClientRect(), s = t.ownerSVGElement.getBoundingClientRect();
    if (r.width > 0 && visible(t))
      out.push({text: t.textContent, l: r.left, r: r.right, t: r.top, b: r.bottom, box: {l: s.left, r: s.right}});
  }
  return {boxes: out, width: document.documentElement.clientWidth, scroll: document.documentElement.scrollWidth};
}"""


def _overlaps(boxes: list[dict], tolerance: float = 1.0) -> list[tuple[str, str]]:
    """Pairs of text boxes that intersect by more than ``tolerance`` px both ways."""
    found = []
    ordered = sorted(boxes, key=lambda b: b["t"])
    for i, a in enumerate(ordered):
        for b in ordered[i + 1 :]:
            if b["t"] >= a["b"] - tolerance:
                break
            if min(a["r"], b["r"]) - max(a["l"], b["l"]) > tolerance and min(a["b"], b["b"]) - b["t"] > tolerance:
                found.append((a["text"], b["text"]))
    return found


def _clipped(measured: dict, tolerance: float = 1.0) -> list[str]:
    """Texts that leave their chart (SVG), the box they scroll in or the viewport horizontally."""
    out = []
    for b in measured["boxes"]:
        left, right = (b["box"]["l"], b["box"]["r"]) if b["box"] else (0, measured["width"])
        if b["l"] < left - tolerance or b["r"] > right + tolerance:
            out.append(f"{b['text']!r} spans [{b['l']:.0f}, {b['r']:.0f}] outside [{left:.0f}, {right:.0f}]")
    return out


TABLES = """() => [...document.querySelectorAll('table')].map((table) => {
  const lines = (el) => {  // how many lines an element's text takes
    const range = document.createRange();
    range.selectNodeContents(el);
    const tops = [...range.getClientRects()].filter((r) => r.width > 0).map((r) => r.top).sort((a, b) => a - b);
    return tops.filter((t, i) => i === 0 || t - tops[i - 1] > 4).length;
  };
  const box = table.closest('.wide');
  return {
    columns: [...table.rows[0].cells].map((c, i) => ({  // with the longest line of text a cell of it holds
      text: c.innerText, width: c.getBoundingClientRect().width, lines: lines(c),
      longest: Math.max(...[...table.rows].map((r) => r.cells[i] && r.cells[i].colSpan === 1 ?
        Math.max(...r.cells[i].innerText.split('\\n').map((l) => l.length)) : 0))})),
    tokens: [...table.querySelectorAll('.nw, td.n')].filter((el) => el.innerText.trim())
      .map((el) => ({text: el.innerText, lines: lines(el)})),
    messages: [...table.querySelectorAll('td.msg')].map((c) => ({
      text: c.innerText, width: c.getBoundingClientRect().width, inside: c.scrollWidth <= c.clientWidth + 1})),
    scrolls: box !== null && getComputedStyle(box).overflowX === 'auto',
    wider: box !== null && box.scrollWidth > box.clientWidth + 1,
  };
})"""


def _tables_read(page, name: str, width: int) -> list[dict]:
    """The page's tables are readable: every column at least 60 px wide (or 7 px a character of
    the longest line a cell of it holds, when shorter: a count, "-", a short name), headers on one line, no time,
    number or id broken across lines, every message inside its cell (at least 150 px wide) and,
    where a table is wider than the window, it scrolls inside its own box."""
    tables = page.evaluate(TABLES)
    assert tables, name
    for t in tables:
        narrow = [c for c in t["columns"] if c["width"] < min(60, 7 * c["longest"]) or c["lines"] != 1]
        assert narrow == [], (name, width, narrow)
        broken = [k for k in t["tokens"] if k["lines"] != 1]
        assert broken == [], (name, width, broken)
        assert all(m["inside"] and m["width"] >= 150 for m in t["messages"]), (name, width, t["messages"])
        assert t["scrolls"] or not t["wider"], (name, width)
    return tables


@pytest.mark.airflow
@pytest.mark.parametrize("width", [1280, 800])
def test_the_pages_read_cleanly_at_1280_and_800_px(pages, width):
    """Screenshots in <pytest tmp>/browser0/{overview,sink}-<width>.png. The last batch's failure
    message (401 characters around a long path) wraps inside its cell: the other columns keep
    their width, no date or number breaks inside itself, the whole message is shown."""
    base, tmp = pages
    with _chromium() as browser:
        page = browser.new_page(viewport={"width": width, "height": 900})
        page.goto(f"{base}/auth/login")
        _sign_in(page)
        for name, path in (("overview", "/reconcile/"), ("sink", "/reconcile/sinks/orders")):
            assert page.goto(base + path).status == 200
            page.screenshot(path=str(tmp / f"{name}-{width}.png"), full_page=True)
            measured = page.evaluate(TEXT_BOXES)
            assert len(measured["boxes"]) > 20, measured
            assert _overlaps(measured["boxes"]) == [], (name, width)
            assert _clipped(measured) == [], (name, width)
            assert measured["scroll"] <= measured["width"], (name, width, measured)  # no sideways scrolling
            words = page.locator("body").inner_text()
            assert not re.search(r"\d[eE][+-]?\d", words), re.search(r".{30}\d[eE][+-]?\d.{10}", words)
            tables = _tables_read(page, name, width)
            messages = [m for t in tables for m in t["messages"] if LONG_MESSAGE in m["text"].replace("\n", "")]
            assert len(messages) == 1, (name, width)  # the whole message, in one cell
            assert sum(len(k["text"]) >= 24 and k["text"].startswith("2026-") for t in tables for k in t["tokens"]) >= 2
        ledger = tables[-1]
        assert [c["text"] for c in ledger["columns"]][:2] == ["batch [lower, upper) UTC", "state / cause"]
        assert ledger["wider"] == (width < 1280), ledger  # 800 px: the ledger scrolls in its box, not squeezed
        charts = page.locator("svg")
        assert charts.count() == 3
        for i in range(3):  # each chart fits the page: nothing overflows at 800 px
            box = charts.nth(i).bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width
        axis = page.locator("svg text").all_text_contents()
        assert sum(bool(re.fullmatch(r"2026-01-0[1-3]", t)) for t in axis) >= 3, axis  # UTC dates on the axes
        assert any(re.fullmatch(r"\d+ h", t) for t in axis), axis  # the lag at commit in hours, round ticks
        assert "1M" in axis, axis  # a million rows reads as 1M
        # the zero-row batch and the one-row drift next to the million-row batch are marked, visibly
        empty = page.locator("svg circle", has=page.locator("title", has_text="no change (0 rows)"))
        drift = page.locator("svg path", has=page.locator("title", has_text="drift 1 rows repaired"))
        assert empty.count() == 1 and drift.count() == 1
        for marker in (empty, drift):
            box = marker.bounding_box()
            assert box is not None and box["width"] >= 5 and box["height"] >= 5, box
        assert page.locator(".legend", has_text="no change (0 rows)").is_visible()


RED, GREY = "rgb(176, 0, 32)", "rgb(119, 119, 119)"  # the pages' bad and done tones


def _colour(locator) -> str:
    return locator.evaluate("(el) => getComputedStyle(el).color")


def _foreign_writes(cfg) -> None:
    """Three Delta versions another writer (delta-rs) commits to the shard: an append of a key the
    source never had, a delete of a key's rows, a changed value (by user ``nightly-fix``)."""
    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable, write_deltalake

    from reconcile.storage.delta import ShardTable

    path = ShardTable(cfg).path
    first = DeltaTable(path).to_pyarrow_table().slice(0, 1)  # a row as the sink writes them, any columns
    row = first.set_column(0, "k", pa.array([7], pa.int64())).set_column(1, "v", pa.array(["zz"]))
    write_deltalake(path, row, mode="append")
    DeltaTable(path).delete("k = 2")
    fixer = CommitProperties(custom_metadata={"userName": "nightly-fix"})
    DeltaTable(path).update(new_values={"v": "changed"}, predicate="k = 3", commit_properties=fixer)


@pytest.mark.airflow
def test_unrepaired_drift_is_red_above_the_ledger_until_the_next_batch_repairs_it(pages, spark, monkeypatch):
    """Before the next batch, the sink page shows each foreign version in red above the charts
    and the ledger (version, operation, writer, rows, when, and that the next batch repairs it,
    as ``status`` says) and the overview marks the sink red; after the next batch nothing on
    either page is red and the versions are grey on the row of the batch that repaired them.
    Screenshots: <pytest tmp>/browser0/drift-{before,after}-800.png."""
    import deltalake

    from reconcile import report
    from reconcile.log import iso
    from reconcile.storage.delta import ShardTable
    from reconcile.storage.ledger import Ledger

    base, tmp = pages
    url = f"sqlite:///{tmp / 'meta.db'}"
    for k, v in dict(
        RECONCILE_METADATA_URL=url, RECONCILE_SINKS_DIR=str(tmp), RECONCILE_WAREHOUSE=str(tmp / "wh")
    ).items():
        monkeypatch.setenv(k, v)
    source = {"sources": {"src": {"format": "json", "path": "drifted_src"}}, "sql": "SELECT k, v FROM src"}
    cfg = make_sink(tmp, "drifted", query=source)
    rows = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"k": 3, "v": "c"}]
    write_json_rows(tmp / "drifted_src", rows)
    ledger = Ledger(url)
    try:
        run_stages(spark, ledger, cfg, "run-1", 200)
        own = ShardTable(cfg).latest_version()
        _foreign_writes(cfg)
        said = report.status_data(ledger, cfg.name)["foreign_unrepaired"]  # what `status` lists
        assert [f["version"] for f in said] == [own + 1, own + 2, own + 3], said
        expected = {  # operation, user, rows (added and removed: the files rewritten hold more)
            own + 1: ("WRITE", None, r"\+1 rows"),
            own + 2: ("DELETE", None, r"\+(\d+) -(\d+) rows \(net -1\)"),
            own + 3: ("UPDATE", "nightly-fix", r"\+(\d+) -\1 rows \(net \+0\)"),
        }
        with _chromium() as browser:
            page = browser.new_page(viewport={"width": 800, "height": 900})
            page.goto(f"{base}/auth/login")
            _sign_in(page)
            assert page.goto(f"{base}/reconcile/sinks/drifted").status == 200
            page.screenshot(path=str(tmp / "drift-before-800.png"), full_page=True)
            section = page.locator("#unrepaired")
            assert section.locator("h2").inner_text() == "Drift not yet repaired: 3 foreign Delta version(s)"
            assert _colour(section.locator("h2")) == RED
            top = section.bounding_box()
            assert top is not None and top["y"] < min(page.locator("svg").first.bounding_box()["y"], 900)
            found = section.locator("tr.unrepaired")
            assert found.count() == 3
            for i, f in enumerate(said):
                cells = found.nth(i).locator("td")
                text = cells.all_inner_texts()
                operation, user, rows_shown = expected[f["version"]]
                by = f"delta-rs:py-{deltalake.__version__}" + (f", user {user}" if user else "")
                assert text[:2] == [str(f["version"]), f"{operation} by {by}\n{iso(f['timestamp'])}"], text
                assert re.fullmatch(rows_shown, text[2]), text
                assert text[3] == f["why"] and "the next batch" in text[3], text
                assert [_colour(cells.nth(j)) for j in range(4)] == [RED] * 4
                box = cells.nth(3).bounding_box()  # in view at 800 px, no scrolling sideways
                assert box is not None and box["x"] + box["width"] <= 800, box
            measured = page.evaluate(TEXT_BOXES)
            assert _overlaps(measured["boxes"]) == [] and _clipped(measured) == []
            _tables_read(page, "drifted", 800)

            page.goto(f"{base}/reconcile/")
            row = page.locator("tr", has=page.get_by_role("link", name="drifted", exact=True))
            mark = row.locator("td").nth(4)  # its drift (its lag is red too: the sink's dates are of 1970)
            versions = ", ".join(f"v{own + i}" for i in (1, 2, 3))
            assert mark.inner_text() == f"3 foreign Delta version(s) not yet repaired ({versions})"
            assert _colour(mark.locator(".bad")) == RED
            box = mark.bounding_box()
            assert box is not None and box["x"] + box["width"] <= 800, box

            run_stages(spark, ledger, cfg, "run-2", 300)  # the next batch repairs them
            assert shard_as_of(cfg, 299) == {(r["k"], r["v"], None): 1 for r in rows}
            assert report.status_data(ledger, cfg.name)["foreign_unrepaired"] == []
            repair = ledger.batch_of_run(cfg.name, "run-2")
            assert page.goto(f"{base}/reconcile/sinks/drifted").status == 200
            page.screenshot(path=str(tmp / "drift-after-800.png"), full_page=True)
            assert page.locator("#unrepaired").count() == 0 and page.locator(".bad").count() == 0
            ledger_rows = page.locator("tr", has_text="run-")
            assert ledger_rows.count() == 2
            for i in range(2):
                drift = ledger_rows.nth(i).locator("td").nth(5)
                if "run-2" not in ledger_rows.nth(i).inner_text():
                    assert drift.inner_text() == "-"
                    continue
                assert drift.locator("span.done").first.inner_text() == f"drift {repair.drift_rows}"
                assert _colour(drift.locator("span.done").first) == GREY
                text = drift.inner_text()
                for v, (operation, _, rows_shown) in expected.items():
                    line = next(x for x in text.split("\n") if x.startswith(f"Delta v{v}: "))
                    assert line.startswith(f"Delta v{v}: {operation} by delta-rs"), text
                    assert re.search(", " + rows_shown + ", ", line), line
            page.goto(f"{base}/reconcile/")
            row = page.locator("tr", has=page.get_by_role("link", name="drifted", exact=True))
            mark = row.locator("td").nth(4)
            assert mark.inner_text() == f"drift {repair.drift_rows} (repaired)" and mark.locator(".bad").count() == 0
            assert _colour(mark.locator(".done")) == GREY
    finally:
        ledger.dispose()


def test_the_text_checks_catch_overlapping_and_clipped_text():
    """The measurement above finds what it looks for: a legend drawn over an axis label (the
    old charts' fault), a title running out of its chart, a table wider than the window."""
    page_html = (
        "<body style='margin:0'><svg viewBox='0 0 300 100' width=300 font-size=12>"
        "<text x=10 y=20>lag (commit time - upper)</text><text x=20 y=22>1.79561E+12</text>"
        "<text x=200 y=60>rows per batch (ok, errors, drift)</text></svg>"
        "<p>fits</p><table><tr><td style='white-space:nowrap'>" + "x" * 300 + "</td></tr></table></body>"
    )
    with _chromium() as browser:
        page = browser.new_page(viewport={"width": 800, "height": 600})
        page.set_content(page_html)
        measured = page.evaluate(TEXT_BOXES)
    assert _overlaps(measured["boxes"]) == [("lag (commit time - upper)", "1.79561E+12")]
    clipped = sorted(_clipped(measured))
    assert [c[:8] for c in clipped] == ["'rows pe", "'xxxxxxx"], clipped
    assert measured["scroll"] > measured["width"]
