"""The shard pages (served inside Airflow's api-server by reconcile.airflow.plugin, behind
Airflow's own authentication; a browser without a session is sent to Airflow's login page).

- Overview: per sink its upper, lag (red past the sink's ``alert.lag_minutes``), since, read-
  only, the last batch's state with the cause of any failure, drift flagged; invalid configs.
- A page per sink: three charts of its newest committed batches, then the ledger paged by key
  (fast at any depth), each batch linked to its Airflow run and task log, drift attributed to
  the foreign Delta versions that caused it.

Charts: inline SVG (no script, no network), as wide as the page up to 720 px; each has its
title and a legend on rows of their own above it, and every label stays inside it.

- *upper at each commit, as lag behind now* (now - upper) and *lag at each commit* (commit
  time - upper, with the alert threshold dashed): x is the commit time, ticks at round UTC
  dates or times of day; y a lag in s, min, h or d (picked by its size) at round numbers.
- *rows per batch*: a bar per batch (ok, errors, drift stacked, linear; a part that is not 0
  is at least 2 px tall), x labelled by the batch uppers in UTC. Below the axis, a marker
  row: a triangle for each batch that repaired drift (seen next to a million-row batch), a
  grey dot for each batch that changed nothing (0 rows).

No number is written in exponent notation. Reads the ledger and the Delta log (plain Python,
no Spark) per request. Every time in the tables is ISO UTC with the ms value beside it.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

from reconcile.config import SinkConfig
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
    "td,th{border:1px solid #ccc;padding:4px 6px;vertical-align:top;text-align:left;overflow-wrap:anywhere}"
    "table{border-collapse:collapse;margin:.5em 0}th{background:#f4f4f4}"
    ".bad{color:#b00020;font-weight:600}.warn{color:#a05a00}.ok{color:#1b6e20}.done{color:#777}"
    ".small{color:#666;font-size:85%}td.run{overflow-wrap:anywhere;min-width:7em}"
    "@media (max-width:900px){table{font-size:85%}}"
    "figure.chart{margin:.8em 0 1.2em;max-width:720px}figcaption{margin-bottom:2px}"
    ".legend{font-size:12px;margin:0 0 3px}.legend span{display:inline-block;margin-right:1.2em}"
    "svg{display:block;width:100%;max-width:720px;height:auto;border:1px solid #ddd}"
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


# -- charts (inline SVG, no script) ---------------------------------------------------------------

W, H = 720, 210  # a chart's viewBox; it scales down with the page (width 100%, max-width W)
LEFT, RIGHT, TOP = 64, 44, 14  # plot margins: y tick labels left, half a date label right
FONT = 11
LABEL_PX = 110  # room one x tick label needs ("2026-01-01" at 11 px is about 62 px wide)
SECOND, MINUTE, HOUR, DAY = 1_000, 60_000, 3_600_000, 86_400_000
TIME_STEPS = [  # x tick steps, the first that gives few enough ticks wins
    *(s * SECOND for s in (1, 2, 5, 10, 15, 30)),
    *(m * MINUTE for m in (1, 2, 5, 10, 15, 30)),
    *(h * HOUR for h in (1, 2, 3, 6, 12)),
    *(d * DAY for d in (1, 2, 7, 14, 28, 56, 91, 182, 364, 728, 1820, 3640, 7280)),
]
LAG_UNITS = [("s", SECOND, 2 * MINUTE), ("min", MINUTE, 2 * HOUR), ("h", HOUR, 3 * DAY), ("d", DAY, None)]
BLUE, RED, ORANGE, GREY = "#1565c0", "#c62828", "#ef6c00", "#757575"


def _nice_step(raw: float) -> float:
    """The smallest of 1, 2, 5 times a power of ten at or above ``raw`` (> 0)."""
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw * (1 - 1e-9))


def nice_ticks(lo: float, hi: float, most: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (at most ``most`` + 1 of them, the ends included)."""
    if hi <= lo:
        hi = lo + 1
    step = _nice_step((hi - lo) / most)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [i * step for i in range(first, last + 1)]


def number(value: float, step: float = 1) -> str:
    """A tick value without exponent notation: ``1,500``, ``0.5``; ``step`` (1, 2 or 5 times a
    power of ten) sets the decimals."""
    return f"{value:,.{max(0, -math.floor(math.log10(step) + 1e-9))}f}"


def count(value: float) -> str:
    """A row count on an axis: ``950``, ``250k``, ``1.5M``, ``2G`` (never ``1E+06``)."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:,.1f}".removesuffix(".0") + suffix
    return f"{value:,.0f}"


def lag_unit(largest_ms: float) -> tuple[str, int]:
    """The unit a lag axis reads in, picked by the largest lag: s, min, h or d."""
    for name, size, below in LAG_UNITS:
        if below is None or abs(largest_ms) < below:
            return name, size
    raise AssertionError("unreachable: the last unit has no bound")


def _utc(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


def time_labels(times: list[int], step: int) -> list[list[str]]:
    """Tick labels of UTC times, one list of lines per tick: a date per tick when the step is a
    day or more, else the time of day (seconds only when the step needs them) with the date
    below it on the first tick and wherever the date changes."""
    out, last_day = [], None
    for t in times:
        at = _utc(t)
        day = at.strftime("%Y-%m-%d")
        if step >= DAY:
            out.append([day])
        else:
            clock = at.strftime("%H:%M:%S" if step < MINUTE or at.second else "%H:%M")
            out.append([clock, day] if day != last_day else [clock])
        last_day = day
    return out


def time_ticks(x0: int, x1: int, plot_px: float) -> tuple[list[int], int]:
    """Round UTC tick times within [x0, x1] (few enough that their labels never touch) and the step."""
    most = max(1, int(plot_px // LABEL_PX))
    step = next((s for s in TIME_STEPS if (x1 - x0) / s <= most), TIME_STEPS[-1])
    first = -(-x0 // step) * step
    return list(range(first, x1 + 1, step)), step


def _text(x: float, y: float, body: str, anchor: str = "middle", fill: str = "#333") -> str:
    return f"<text x='{x:.1f}' y='{y:.1f}' text-anchor='{anchor}' fill='{fill}'>{e(body)}</text>"


def _svg(label: str, height: int, parts: list[str]) -> str:
    return (
        f"<svg viewBox='0 0 {W} {height}' width='100%' preserveAspectRatio='xMinYMin meet' role=img "
        f"aria-label='{e(label)}' font-size={FONT} font-family='system-ui,sans-serif'>{''.join(parts)}</svg>"
    )


def _figure(title: str, note: str, legend: list[tuple[str, str, str]], svg: str) -> str:
    """A chart: its title and what the axes show, its legend on a row of its own, the SVG.
    ``legend``: (mark: line/dash/box/dot/up, colour, text)."""
    marks = {"line": "&#9472;&#9472;", "dash": "- -", "box": "&#9632;", "dot": "&#9679;", "up": "&#9650;"}
    keys = "".join(f"<span><b style='color:{c}'>{marks[m]}</b> {e(t)}</span>" for m, c, t in legend)
    return (
        f"<figure class=chart><figcaption><b>{e(title)}</b> <span class=small>{e(note)}</span></figcaption>"
        f"<div class=legend>{keys}</div>{svg}</figure>"
    )


def _empty(title: str) -> str:
    return _figure(title, "", [], _svg(title, 40, [_text(8, 24, "no committed batch yet", "start")]))


def _x_axis(ticks: list[tuple[float, list[str]]], base: float) -> list[str]:
    """Tick marks below ``base`` and their label lines."""
    out = []
    for x, lines in ticks:
        out.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{base:.1f}' y2='{base + 4:.1f}' stroke='#999'/>")
        out += [_text(x, base + 16 + 13 * i, line) for i, line in enumerate(lines)]
    return out


def _y_axis(values: list[float], to_y, text) -> list[str]:
    """Horizontal grid lines at ``values`` with their labels left of the plot."""
    out = []
    for v in values:
        y = to_y(v)
        out.append(f"<line x1='{LEFT}' x2='{W - RIGHT}' y1='{y:.1f}' y2='{y:.1f}' stroke='#eee'/>")
        out.append(_text(LEFT - 6, y + 4, text(v), "end"))
    return out


def _svg_lines(
    title: str,
    note: str,
    series: dict[str, tuple[str, list[tuple[int, int]]]],
    threshold: int | None = None,
    from_zero: bool = True,
) -> str:
    """Lags over time: ``series`` name -> (colour, [(x: a time in ms, y: a lag in ms)]). The y axis
    reads in the unit the largest lag asks for, with round ticks, from 0 unless ``from_zero`` is
    false (then around the lags, so that a small change of a large lag shows, when it is at least
    a hundredth of the unit); the x axis in UTC
    dates and times; ``threshold`` (a lag, ms) draws the alert line when it falls in the chart."""
    points = [p for _, pts in series.values() for p in pts]
    if not points:
        return _empty(title)
    plot_w, base = W - LEFT - RIGHT, H - 44
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    if x1 - x0 < 2 * SECOND:  # one commit (or a few within a second): a minute around them
        x0, x1 = x0 - 30 * SECOND, x1 + 30 * SECOND
    lo, hi = min(p[1] for p in points), max(p[1] for p in points)
    unit, size = lag_unit(max(abs(lo), abs(hi)))
    ys = nice_ticks(lo / size, hi / size, 4)
    if from_zero or ys[1] - ys[0] < 0.01:  # a change too small to read against the lag: from 0
        ys = nice_ticks(min(0, lo) / size, max(size, hi) / size, 4)
    step = ys[1] - ys[0]

    def to_x(t: float) -> float:
        return LEFT + (t - x0) * plot_w / (x1 - x0)

    def to_y(v: float) -> float:  # v in the unit
        return base - (v - ys[0]) * (base - TOP) / (ys[-1] - ys[0])

    times, tstep = time_ticks(x0, x1, plot_w)
    parts = _y_axis(ys, to_y, lambda v: f"{number(v, step)} {unit}")
    parts.append(f"<line x1='{LEFT}' x2='{W - RIGHT}' y1='{to_y(0):.1f}' y2='{to_y(0):.1f}' stroke='#999'/>")
    parts += _x_axis(list(zip(map(to_x, times), time_labels(times, tstep), strict=True)), base)
    legend = []
    if threshold is not None:
        if ys[0] <= threshold / size <= ys[-1]:
            y = to_y(threshold / size)
            parts.append(
                f"<line x1='{LEFT}' x2='{W - RIGHT}' y1='{y:.1f}' y2='{y:.1f}' stroke='{RED}' stroke-dasharray='5 4'/>"
            )
        above = " (above the chart)" if threshold / size > ys[-1] else ""
        legend.append(("dash", RED, f"alert past {duration(threshold)}{above}"))
    for name, (colour, pts) in series.items():
        path = " ".join(f"{to_x(x):.1f},{to_y(y / size):.1f}" for x, y in pts)
        parts.append(f"<polyline fill=none stroke='{colour}' stroke-width=1.5 points='{path}'/>")
        parts += [
            f"<circle cx='{to_x(x):.1f}' cy='{to_y(y / size):.1f}' r=2 fill='{colour}'>"
            f"<title>{e(iso_text(x))}: {e(name)} {duration(y) if y >= 0 else '-' + duration(-y)}</title></circle>"
            for x, y in pts
        ]
        legend.insert(0, ("line", colour, name))
    return _figure(title, note, legend, _svg(title, H, parts))


def _labelled(bars: list, step: float, plot_w: float) -> tuple[list[int], list[list[str]]]:
    """The bars whose uppers label the x axis (those nearest to round UTC times, at least
    :data:`LABEL_PX` apart) and their labels: dates when the round times are days apart, else
    times of day (to the second where an upper needs it) with their dates."""
    uppers = [b.upper for b in bars]
    times, tick = time_ticks(uppers[0], uppers[-1], plot_w)
    shown: list[int] = []
    for t in times or uppers[:1]:
        i = min(range(len(uppers)), key=lambda k: abs(uppers[k] - t))
        if not shown or (i - shown[-1]) * step >= LABEL_PX:
            shown.append(i)
    at = [uppers[i] for i in shown]
    return shown, time_labels(at, DAY if tick >= DAY else SECOND if any(u % MINUTE for u in at) else MINUTE)


def _svg_bars(title: str, bars: list) -> str:
    """Rows per committed batch, oldest to newest, one bar each (ok, errors and drift stacked,
    linear, a part that is not 0 at least 2 px tall); below the axis a marker row: an orange
    triangle for every batch that repaired drift (of any size), a grey dot for a batch that
    changed nothing (0 rows). The x labels are batch uppers in UTC."""
    if not bars:
        return _empty(title)
    plot_w, base = W - LEFT - RIGHT, H - 56
    marks_y = base + 10
    parts_of = [(b.rows_ok or 0, b.rows_err or 0, b.drift_rows or 0) for b in bars]
    ys = nice_ticks(0, max(4, max(sum(p) for p in parts_of)), 4)  # whole rows: steps of 1 or more
    step = plot_w / len(bars)
    width = max(step * 0.8, 1.0)

    def to_y(v: float) -> float:
        return base - v * (base - TOP) / ys[-1]

    parts = _y_axis(ys, to_y, count)
    for i, (b, values) in enumerate(zip(bars, parts_of, strict=True)):
        x, tip = LEFT + i * step + (step - width) / 2, f"[{iso_text(b.lower)}, {iso_text(b.upper)})"
        y: float = base
        for value, colour, name in zip(values, (BLUE, RED, ORANGE), ("ok", "errors", "drift"), strict=True):
            if value:
                h = max(value * (base - TOP) / ys[-1], 2.0)
                y -= h
                parts.append(
                    f"<rect x='{x:.1f}' y='{y:.1f}' width='{width:.1f}' height='{h:.1f}' fill='{colour}'>"
                    f"<title>{e(tip)}: {name} {value:,}</title></rect>"
                )
        middle = x + width / 2
        if values[2]:
            parts.append(
                f"<path d='M{middle - 4:.1f},{marks_y + 4:.1f} L{middle + 4:.1f},{marks_y + 4:.1f} "
                f"L{middle:.1f},{marks_y - 4:.1f} Z' fill='{ORANGE}'><title>{e(tip)}: drift {values[2]:,} "
                "rows repaired</title></path>"
            )
        elif not any(values):
            parts.append(
                f"<circle cx='{middle:.1f}' cy='{marks_y:.1f}' r=3 fill='{GREY}'>"
                f"<title>{e(tip)}: no change (0 rows)</title></circle>"
            )
    parts.append(f"<line x1='{LEFT}' x2='{W - RIGHT}' y1='{base:.1f}' y2='{base:.1f}' stroke='#999'/>")
    shown, labels = _labelled(bars, step, plot_w)
    centres = [LEFT + (i + 0.5) * step for i in shown]
    parts += _x_axis(list(zip(centres, labels, strict=True)), marks_y + 6)
    legend = [
        ("box", BLUE, "ok"),
        ("box", RED, "errors"),
        ("box", ORANGE, "drift repaired"),
        ("up", ORANGE, "drift (any count, marked below the axis)"),
        ("dot", GREY, "no change (0 rows)"),
    ]
    return _figure(title, "x: each batch by its upper, UTC; y: rows, linear", legend, _svg(title, H, parts))


FOREIGN_SHOWN = 20  # foreign Delta versions listed per drifting batch


def foreign_versions(cfg: SinkConfig, after: int, up_to: int) -> tuple[list[ForeignCommit], int]:
    """The foreign Delta versions in (after, up_to] that changed data (what ``write.drift_rows``
    measures): at most :data:`FOREIGN_SHOWN` of them, with their count."""
    found = ShardTable(cfg).foreign_commits(after, up_to)
    return found[:FOREIGN_SHOWN], len(found)


def _drift_cell(cfg: SinkConfig, b, previous, committed: list) -> str:
    """A batch's drift: grey once every foreign version behind it is repaired (the shard holds
    what the sink's source defines again), red while one is not, with why; then its causes."""
    if not b.drift_rows:
        return _drift(b)
    from reconcile import kinds
    from reconcile import standing as st

    try:
        writers, _ = foreign_versions(cfg, _drift_base(previous), b.read_version or -1)
        fate = st.fates(committed, writers, kinds.repairs_by_key(cfg))
    except Exception:  # noqa: BLE001 - an unreadable log: said by the causes below
        fate = {}
    open_ = [f for f in fate.values() if not f.repaired]
    if fate and not open_:
        at = max(f.batch.delta_version or 0 for f in fate.values() if f.batch is not None)
        head = f"<span class=done>drift {b.drift_rows}</span> (rows repaired at version {at})"
    else:
        why = open_[0].why if open_ else "not known to be repaired"
        head = f"<span class=bad>drift {b.drift_rows}</span> ({e(why)})"
    return head + _drift_cause(cfg, b, previous)


def _drift_base(previous) -> int:
    """The Delta version the committed batch before a batch read (-1: none)."""
    if previous is None:
        return -1
    seen = previous.read_version if previous.read_version is not None else previous.delta_version
    return -1 if seen is None else seen


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


def _charts(committed: list, now: int, shard_upper: int, threshold: int | None) -> str:
    """The three charts of a sink's page over its newest committed batches (oldest first)."""
    at = sorted(((to_millis(b.updated_at) if b.updated_at else b.upper, b) for b in committed), key=lambda p: p[0])
    return (
        _svg_lines(
            "upper at each commit, as lag behind now",
            "x: commit time, UTC; y: now − upper",
            {f"now − upper (the lag now: {duration(now - shard_upper)})": (BLUE, [(t, now - b.upper) for t, b in at])},
            from_zero=False,
        )
        + _svg_lines(
            "lag at each commit",
            "x: commit time, UTC; y: commit time − upper",
            {"commit time − upper": (BLUE, [(t, t - b.upper) for t, b in at])},
            threshold,
        )
        + _svg_bars("rows per batch", committed)
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
        committed_all = store.batches(cfg.name, (COMMITTED,)) if previous else []
        left = _behind(cfg.name, store.batches(cfg.name, (SUPERSEDED, *OPEN_STATES)), shard.upper)
    finally:
        store.dispose()
    committed = sorted((b for b in newest if b.state == COMMITTED), key=lambda b: b.lower)
    charts = _charts(committed, now_ms(), shard.upper, lag_threshold_ms(cfg))
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
        drift = _drift_cell(cfg, b, previous.get(b.batch_id), committed_all)
        rows.append(
            f"<tr><td>{_time(b.lower)}</td><td>{_time(b.upper)}</td><td>{_state(b, shard.upper)}</td>"
            f"<td>{_count(b.delta_version)}</td><td>{_count(b.rows_ok)}</td><td>{_count(b.rows_err)}</td>"
            f"<td>{drift}</td><td class=run>{e(b.run_id or '-')}<br>{links}</td></tr>"
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
