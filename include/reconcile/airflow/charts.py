"""The chart kit of the shard pages: small inline SVG charts (no script, no network) wrapped in
HTML figures, as wide as the page up to 720 px; each has its title and a legend on rows of their
own above it, and every label stays inside it.

- :func:`svg_lines`: lags over time (x: a time, ticks at round UTC dates or times of day; y: a
  lag in s, min, h or d, picked by its size, at round numbers), with an alert threshold dashed.
- :func:`svg_bars`: rows per batch (ok, errors, drift stacked, linear; a part that is not 0 is
  at least 2 px tall), x labelled by the batch uppers in UTC. Below the axis, a marker row: a
  triangle for each batch that repaired drift (seen next to a million-row batch), a grey dot
  for each batch that changed nothing (0 rows).

No number is written in exponent notation.
"""

from __future__ import annotations

import html
import math
from datetime import UTC, datetime, timedelta

from reconcile.report import duration, iso_text

e = html.escape
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


def svg_lines(
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


def svg_bars(title: str, bars: list) -> str:
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
