"""The shard pages (served inside Airflow's api-server by reconcile.airflow.plugin, behind
Airflow's own authentication).

- Overview: per sink its upper, lag (red past the sink's ``alert.lag_minutes``), since, read-
  only, the last batch's state with the cause of any failure, drift flagged; invalid configs.
- A page per sink: charts of upper and lag over time and of rows per batch (ok, errors, drift),
  the ledger paged by key (fast at any depth), each batch linked to its Airflow run and task
  log, drift attributed to the foreign Delta versions that caused it.

Reads the ledger and the Delta log (plain Python, no Spark) per request. Every time is
ISO UTC with the ms value beside it.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from urllib.parse import quote

from reconcile.config import SinkConfig
from reconcile.log import iso
from reconcile.report import duration, iso_parts, iso_text
from reconcile.schedule import now_ms, schedule_period_ms, to_millis
from reconcile.standing import behind, standing
from reconcile.storage.commits import ForeignCommit
from reconcile.storage.delta import ShardTable

e = html.escape
PAGE = 50  # ledger rows per page
CHART_BATCHES = 200  # the charts show the newest batches

STYLE = (
    "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}"
    "td,th{border:1px solid #ccc;padding:4px 6px;vertical-align:top;text-align:left}"
    "table{border-collapse:collapse;margin:.5em 0}th{background:#f4f4f4}"
    ".bad{color:#b00020;font-weight:600}.warn{color:#a05a00}.ok{color:#1b6e20}.done{color:#777}"
    ".small{color:#666;font-size:85%}svg{border:1px solid #ddd;margin:.5em 1em .5em 0}"
)


def _time(ms: int | None) -> str:
    """An ISO time with its ms beside it (small)."""
    if ms is None:
        return "-"
    day, rest = iso_parts(ms)
    return f"{e(day)} <span class=small>{e(rest)}</span>"


def lag_threshold_ms(cfg: SinkConfig) -> int | None:
    """When a sink's lag turns red: ``alert.lag_minutes``, else twice its schedule's period."""
    if cfg.alert.lag_minutes is not None:
        return cfg.alert.lag_minutes * 60_000
    period = schedule_period_ms(cfg.schedule)
    return 2 * period if period else None


def _page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>{e(title)}</title>"
        f"<style>{STYLE}</style></head><body>{body}</body></html>"
    )


def _state(b, shard_upper: int) -> str:
    """A batch's state and note, coloured as it stands (:mod:`reconcile.standing`): red only for
    an unresolved failure; grey for superseded, covered and resolved."""
    how = standing(b, shard_upper)
    note = f"<br><span class={how.note_tone}>{e(how.note)}</span>" if how.note else ""
    return f"<span class={how.tone}>{e(b.state)}</span>{note}"


def _behind(name: str, batches, shard_upper: int) -> str:
    """The line naming the run to clear when a superseded run left the shard behind (or "")."""
    left = behind(batches, shard_upper)
    return "" if left is None else f"<p class=warn>{e(left.line(name))}</p>"


def _drift(b) -> str:
    return f"<span class=bad>drift {b.drift_rows}</span>" if b.drift_rows else "-"


def render_overview(can_read: Callable[[str], bool] = lambda name: True) -> str:
    from reconcile import settings
    from reconcile.config import load_dir
    from reconcile.errors import SinkError
    from reconcile.model import OPEN_STATES, SUPERSEDED
    from reconcile.storage.ledger import Ledger

    configs, errors = load_dir()
    now = now_ms()
    rows = []
    store = Ledger(settings.metadata_url())
    try:
        for cfg in configs:
            if not can_read(cfg.name):
                continue
            link = f"<a href='sinks/{quote(cfg.name)}'>{e(cfg.name)}</a>"
            try:
                shard = store.get_shard(cfg.name)
            except SinkError:
                rows.append(
                    f"<tr><td>{link}</td><td>{e(cfg.kind)}</td><td colspan=6>no shard yet (no run minted)</td></tr>"
                )
                continue
            lag, limit = now - shard.upper, lag_threshold_ms(cfg)
            late = limit is not None and lag > limit
            lag_cell = f"<span class={'bad' if late else 'ok'}>{duration(lag)}</span>" + (
                f" <span class=small>(alert past {duration(limit)})</span>" if limit else ""
            )
            last = store.last_batch(cfg.name)
            last_cell = (
                "-" if last is None else f"[{_time(last.lower)}, {_time(last.upper)}) {_state(last, shard.upper)}"
            )
            last_cell += _behind(cfg.name, store.batches(cfg.name, (SUPERSEDED, *OPEN_STATES)), shard.upper)
            rows.append(
                f"<tr><td>{link}</td><td>{e(cfg.kind)}</td><td>{_time(shard.upper)}</td><td>{lag_cell}</td>"
                f"<td>{_time(shard.since) if shard.since else 'never compacted'}</td>"
                f"<td>{'yes' if shard.read_only else 'no'}</td><td>{last_cell}</td>"
                f"<td>{_drift(last) if last else '-'}</td></tr>"
            )
    finally:
        store.dispose()
    return _page(
        "Reconcile shards",
        "<h1>Reconcile shards</h1><table><tr><th>sink</th><th>kind</th><th>upper (UTC)</th><th>lag</th>"
        f"<th>since</th><th>read-only</th><th>last batch</th><th>drift</th></tr>{''.join(rows)}</table>"
        + _invalid(errors),
    )


def _invalid(errors) -> str:
    if not errors:
        return ""
    return "<h2>Invalid sink configs</h2><ul>" + "".join(f"<li>{e(str(err))}</li>" for err in errors) + "</ul>"


def _svg_lines(title: str, series: dict[str, list[tuple[int, float]]], unit: str) -> str:
    """A small line chart (inline SVG): ``series`` name -> [(x ms, y)]."""
    width, height, pad = 560, 180, 36
    points = [p for s in series.values() for p in s]
    if not points:
        return f"<svg width={width} height=40><text x=8 y=24>{e(title)}: no committed batch yet</text></svg>"
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(0.0, min(p[1] for p in points)), max(p[1] for p in points)
    sx = (width - 2 * pad) / ((x1 - x0) or 1)
    sy = (height - 2 * pad) / ((y1 - y0) or 1)
    colours = ["#1565c0", "#c62828", "#2e7d32"]
    out = [f"<svg width={width} height={height} role=img aria-label='{e(title)}'><title>{e(title)}</title>"]
    out.append(f"<text x={pad} y=16 font-size=12>{e(title)} ({e(unit)}; {e(iso_text(x0))} .. {e(iso_text(x1))})</text>")
    for i, (name, pts) in enumerate(series.items()):
        path = " ".join(f"{pad + (x - x0) * sx:.1f},{height - pad - (y - y0) * sy:.1f}" for x, y in pts)
        out.append(f"<polyline fill=none stroke='{colours[i % 3]}' stroke-width=1.5 points='{path}'/>")
        out.append(f"<text x={pad + 90 * i} y=30 font-size=11 fill='{colours[i % 3]}'>{e(name)}</text>")
    out.append(f"<text x=2 y={pad} font-size=10>{y1:g}</text><text x=2 y={height - pad} font-size=10>{y0:g}</text>")
    return "".join(out) + "</svg>"


def _svg_bars(title: str, bars: list[tuple[str, dict[str, int]]]) -> str:
    """Stacked bars per batch (inline SVG): [(label, {series: value})]."""
    width, height, pad = 560, 180, 36
    if not bars:
        return f"<svg width={width} height=40><text x=8 y=24>{e(title)}: no committed batch yet</text></svg>"
    top = max(sum(v.values()) for _, v in bars) or 1
    step = (width - 2 * pad) / len(bars)
    colours = {"ok": "#1565c0", "errors": "#c62828", "drift": "#ef6c00"}
    out = [f"<svg width={width} height={height} role=img aria-label='{e(title)}'><title>{e(title)}</title>"]
    out.append(f"<text x={pad} y=16 font-size=12>{e(title)} (max {top})</text>")
    for i, (label, values) in enumerate(bars):
        y: float = height - pad
        for name, value in values.items():
            h = value / top * (height - 2 * pad)
            y -= h
            out.append(
                f"<rect x={pad + i * step:.1f} y={y:.1f} width={max(step - 1, 1):.1f} height={h:.1f} "
                f"fill='{colours[name]}'><title>{e(label)}: {name} {value}</title></rect>"
            )
    for i, (name, colour) in enumerate(colours.items()):
        out.append(f"<text x={pad + 60 * i} y=30 font-size=11 fill='{colour}'>{name}</text>")
    return "".join(out) + "</svg>"


FOREIGN_SHOWN = 20  # foreign Delta versions listed per drifting batch


def foreign_versions(cfg: SinkConfig, after: int, up_to: int) -> tuple[list[ForeignCommit], int]:
    """The foreign Delta versions in (after, up_to] that changed data (what ``write.drift_rows``
    measures): at most :data:`FOREIGN_SHOWN` of them, with their count."""
    found = ShardTable(cfg).foreign_commits(after, up_to)
    return found[:FOREIGN_SHOWN], len(found)


def _drift_cause(cfg: SinkConfig, b, previous) -> str:
    """Which foreign Delta versions a batch's drift repaired: those after the version the
    previous committed batch read (its commit and anything since) up to this batch's read."""
    if not b.drift_rows or b.read_version is None:
        return ""
    base = -1
    if previous is not None:
        seen = previous.read_version if previous.read_version is not None else previous.delta_version
        base = -1 if seen is None else seen
    try:
        writers, count = foreign_versions(cfg, base, b.read_version)
    except Exception as exc:  # noqa: BLE001 - an unreadable log must not take the page down
        return f"<br><span class=small>the Delta log cannot be read: {e(str(exc)[:200])}</span>"
    if not writers:
        return (
            f"<br><span class=small>foreign Delta versions {base + 1}..{b.read_version}: "
            "none found in the log (cleaned up since?)</span>"
        )
    lines = [
        f"<br><span class=small>Delta v{w.version}: {e(w.operation)} by {e(w.engine)}"
        + (f", user {e(str(w.user))}" if w.user else "")
        + (f", {_time(w.timestamp)}" if w.timestamp is not None else "")
        + "</span>"
        for w in writers
    ]
    if count > len(writers):
        lines.append(f"<br><span class=small>and {count - len(writers)} more foreign versions</span>")
    return "".join(lines)


def _charts(committed: list) -> str:
    at = [(to_millis(b.updated_at) if b.updated_at else b.upper, b) for b in committed]
    return (
        _svg_lines("upper at each commit", {"upper": [(t, b.upper) for t, b in at]}, "epoch ms")
        + _svg_lines(
            "lag at each commit",
            {"lag (commit time - upper)": [(t, (t - b.upper) / 3_600_000) for t, b in at]},
            "hours",
        )
        + _svg_bars(
            "rows per batch",
            [
                (
                    f"[{iso(b.lower)}, {iso(b.upper)})",
                    {"ok": b.rows_ok or 0, "errors": b.rows_err or 0, "drift": b.drift_rows or 0},
                )
                for b in committed
            ],
        )
    )


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def render_sink(name: str, before: tuple[int, str] | None = None, dag_url: str = "/dags") -> str:
    """One sink's page: charts (first page only), then ``PAGE`` ledger rows newest first,
    older than the (lower, batch id) key ``before``."""
    from reconcile import settings
    from reconcile.config import load_sink
    from reconcile.errors import SinkError
    from reconcile.model import COMMITTED, OPEN_STATES, SUPERSEDED
    from reconcile.storage.ledger import Ledger

    cfg = load_sink(name)
    store = Ledger(settings.metadata_url())
    try:
        try:
            shard = store.get_shard(cfg.name)
        except SinkError:
            return _page(
                f"{cfg.name}: reconcile shard",
                f"<p><a href='../'>all shards</a></p><h1>{e(cfg.name)}</h1><p>no shard yet (no run minted)</p>",
            )
        page = store.batch_page(cfg.name, before=before, limit=PAGE)
        newest = store.batch_page(cfg.name, limit=CHART_BATCHES) if before is None else []
        previous = {b.batch_id: store.previous_committed(cfg.name, b.lower) for b in page if b.drift_rows}
        left = _behind(cfg.name, store.batches(cfg.name, (SUPERSEDED, *OPEN_STATES)), shard.upper)
    finally:
        store.dispose()
    charts = _charts(sorted((b for b in newest if b.state == COMMITTED), key=lambda b: b.lower))
    dag = f"{dag_url}/{quote(cfg.name, safe='')}"
    rows = []
    for b in page:
        run = quote(b.run_id or "", safe="")
        links = (
            f"<a href='{dag}/runs/{run}'>run</a> · <a href='{dag}/runs/{run}/tasks/append'>append log</a>"
            f" · <a href='{dag}/runs/{run}/tasks/write'>write log</a>"
            if b.run_id
            else "-"
        )
        drift = (
            _drift(b) + (" (rows repaired)" if b.drift_rows else "") + _drift_cause(cfg, b, previous.get(b.batch_id))
        )
        rows.append(
            f"<tr><td>{_time(b.lower)}</td><td>{_time(b.upper)}</td><td>{_state(b, shard.upper)}</td>"
            f"<td>{_count(b.delta_version)}</td><td>{_count(b.rows_ok)}</td><td>{_count(b.rows_err)}</td>"
            f"<td>{drift}</td><td>{e(b.run_id or '-')}<br>{links}</td></tr>"
        )
    nav = []
    if before is not None:
        nav.append("<a href='?'>newest batches</a>")
    if len(page) == PAGE:
        nav.append(f"<a href='?before={page[-1].lower}:{quote(page[-1].batch_id, safe='')}'>older batches</a>")
    head = (
        f"<p><a href='../'>all shards</a></p><h1>{e(cfg.name)} <span class=small>({e(cfg.kind)})</span></h1>"
        f"<p>upper {_time(shard.upper)} · since {_time(shard.since) if shard.since else 'never compacted'} · "
        f"read-only {'yes' if shard.read_only else 'no'} · Delta version {shard.delta_version}</p>{left}"
    )
    older = f"<p class=small>batches before lower {_time(before[0])}</p>" if before else ""
    return _page(
        f"{cfg.name}: reconcile shard",
        head + (charts if before is None else "") + f"<h2>Ledger</h2>{older}<table><tr><th>lower</th><th>upper</th>"
        "<th>state / cause</th><th>version</th><th>ok</th><th>errors</th><th>drift</th><th>run</th></tr>"
        f"{''.join(rows)}</table><p>{' · '.join(nav)}</p>",
    )
