"""The shard pages (served inside Airflow's api-server by reconcile.airflow.plugin, behind
Airflow's own authentication; a browser without a session is sent to Airflow's login page).

- Overview: every sink, those needing action first under a line of counts per state
  (:mod:`reconcile.fleet`, as ``status`` lists them); per sink its state, upper, lag (red past
  the sink's ``alert.lag_minutes``), since, read-only, the last batch's state with the cause of
  any failure, drift: red while foreign Delta versions are not yet repaired, grey once
  repaired; invalid configs.
- A page per sink: first, in red, the foreign Delta versions no batch repaired yet (``status``'s
  ``foreign_unrepaired``: who wrote each, its rows, when, and that the next batch repairs it or
  why not); three charts of its newest committed batches, then the ledger paged by key (fast at
  any depth), each batch linked to its Airflow run and task log, drift attributed to the foreign
  Delta versions it repaired (grey).

Tables stay readable at any width: a message wraps inside its own cell (never narrower than
16em), times, numbers and ids never break inside a token, and a table wider than the window
scrolls sideways inside its box.

Charts (drawn by the chart kit, :mod:`reconcile.airflow.charts`):

- *upper at each commit, as lag behind now* (now - upper) and *lag at each commit* (commit
  time - upper, with the alert threshold dashed): x is the commit time.
- *rows per batch*: a bar per batch (ok, errors, drift stacked), with the marker row below the
  axis for drift repaired and batches that changed nothing.

Reads the ledger and the Delta log (plain Python, no Spark) per request. Every time in the
tables is ISO UTC with the ms value beside it.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from urllib.parse import quote

from reconcile.airflow.charts import BLUE, svg_bars, svg_lines
from reconcile.config import SinkConfig
from reconcile.report import duration, iso_parts
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
    "table{border-collapse:collapse;margin:.5em 0;font-size:90%}th{background:#f4f4f4;white-space:nowrap}"
    ".wide{overflow-x:auto}.nw,td.n{white-space:nowrap}"
    "td.msg{overflow-wrap:anywhere;min-width:16em}td.drift{overflow-wrap:anywhere;min-width:8em}"
    ".bad{color:#b00020;font-weight:600}.warn{color:#a05a00}.ok{color:#1b6e20}.done{color:#777}"
    ".small{color:#666;font-size:85%}"
    "@media (max-width:900px){table{font-size:85%}}"
    "figure.chart{margin:.8em 0 1.2em;max-width:720px}figcaption{margin-bottom:2px}"
    ".legend{font-size:12px;margin:0 0 3px}.legend span{display:inline-block;margin-right:1.2em}"
    "svg{display:block;width:100%;max-width:720px;height:auto;border:1px solid #ddd}"
)


def _time(ms: int | None) -> str:
    """An ISO time with its ms beside it (small); a line may break between them, never inside."""
    if ms is None:
        return "-"
    day, rest = iso_parts(ms)
    return f"<span class=nw>{e(day)}</span> <span class='small nw'>{e(rest)}</span>"


def _table(head: list[str], rows: list[str]) -> str:
    """A table in a box that scrolls sideways when the table is wider than the window."""
    ths = "".join(f"<th>{e(h)}</th>" for h in head)
    return f"<div class=wide><table><tr>{ths}</tr>{''.join(rows)}</table></div>"


_WHOLE = re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+Z|\b\d+-[0-9a-f]{8,}\b")  # ISO times, batch ids


def _prose(text: str) -> str:
    """A note or message for a page: escaped, its ISO times and batch ids kept whole on a line
    (a browser would break them after a hyphen); the rest wraps where its cell needs it."""
    out, at = [], 0
    for m in _WHOLE.finditer(text):
        out += [e(text[at : m.start()]), f"<span class=nw>{e(m.group())}</span>"]
        at = m.end()
    return "".join(out) + e(text[at:])


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
    note = f"<br><span class={how.note_tone}>{_prose(how.note)}</span>" if how.note else ""
    return f"<span class={how.tone}>{e(b.state)}</span>{note}"


def _behind(name: str, batches, shard_upper: int) -> str:
    """The line naming the run to clear when a superseded run left the shard behind (or "")."""
    left = behind(batches, shard_upper)
    return "" if left is None else f"<p class=warn>{_prose(left.line(name))}</p>"


def _drift(b) -> str:
    return f"<span class=bad>drift {b.drift_rows}</span>" if b.drift_rows else "-"


def _unrepaired_mark(open_: list[dict] | None, last) -> str:
    """The overview's drift cell: red while foreign Delta versions are not yet repaired (``open_``,
    None: the log cannot be read), else the last batch's drift, grey (repaired)."""
    if open_:
        versions = ", ".join(f"v{f['version']}" for f in open_)
        return f"<span class=bad>{len(open_)} foreign Delta version(s) not yet repaired ({e(versions)})</span>"
    if last is None or not last.drift_rows:
        return "-"
    if open_ is None:  # the log cannot be read: not known to be repaired
        return _drift(last)
    return f"<span class=done>drift {last.drift_rows}</span> (repaired)"


STATE_TONE = {"invalid": "bad", "failed": "bad", "late": "bad", "unrepaired": "bad", "current_lagging": "bad"}


def render_overview(can_read: Callable[[str], bool] = lambda name: True) -> str:
    """Every sink the user may read, needing action first (:mod:`reconcile.fleet`: a few ledger
    queries for the whole fleet and a probe of each Delta log), with counts per state."""
    from reconcile import fleet, settings
    from reconcile.config_loading import load_dir
    from reconcile.storage.ledger import Ledger

    configs, errors = load_dir()
    now = now_ms()
    ledger = Ledger(settings.metadata_url())
    try:
        healths = fleet.survey(ledger, configs, errors, now, can_read=can_read)
    finally:
        ledger.dispose()
    rows = []
    for h in healths:
        label = h.state.replace("_", " ")
        state = f"<br><span class='small nw'><span class={STATE_TONE.get(h.state, 'done')}>{e(label)}</span></span>"
        link = f"<a href='sinks/{quote(h.name)}'>{e(h.name)}</a>{state}" if not h.invalid else e(h.name) + state
        if h.invalid:
            rows.append(f"<tr><td>{link}</td><td>-</td><td colspan=6 class='msg bad'>{_prose(h.needs[0])}</td></tr>")
            continue
        if h.shard is None:
            rows.append(f"<tr><td>{link}</td><td>{e(h.kind)}</td><td colspan=6>no shard yet (no run minted)</td></tr>")
            continue
        shard, last, limit = h.shard, h.last, h.lag_limit_ms
        late = limit is not None and (h.lag_ms or 0) > limit
        lag_cell = f"<span class=nw><span class={'bad' if late else 'ok'}>{duration(h.lag_ms or 0)}</span></span>" + (
            f"<br><span class='small nw'>(alert past {duration(limit)})</span>" if limit else ""
        )
        last_cell = "-" if last is None else f"[{_time(last.lower)}, {_time(last.upper)}) {_state(last, shard.upper)}"
        last_cell += "" if h.behind is None else f"<p class=warn>{_prose(h.behind.removeprefix('BEHIND: '))}</p>"
        if h.current:
            last_cell += f"<p class=bad>{_prose(h.current)}</p>"
        drift = _unrepaired_mark(h.unrepaired, last)
        rows.append(
            f"<tr><td>{link}</td><td>{e(h.kind)}</td><td>{_time(shard.upper)}</td><td>{lag_cell}</td>"
            f"<td{'' if drift == '-' else ' class=drift'}>{drift}</td><td class=msg>{last_cell}</td>"
            f"<td>{_time(shard.since) if shard.since else 'never compacted'}</td>"
            f"<td>{'yes' if shard.read_only else 'no'}</td></tr>"
        )
    need = sum(h.needs_action for h in healths)
    summary = f"<p id=counts><span class={'bad' if need else 'ok'}>{e(fleet.counts_line(healths))}</span></p>"
    return _page(
        "Reconcile shards",
        "<h1>Reconcile shards</h1>"
        + summary
        + _table(["sink", "kind", "upper (UTC)", "lag", "drift", "last batch", "since", "read-only"], rows)
        + _invalid(errors),
    )


def _invalid(errors) -> str:
    if not errors:
        return ""
    return "<h2>Invalid sink configs</h2><ul>" + "".join(f"<li>{e(str(err))}</li>" for err in errors) + "</ul>"


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
        head = f"<span class=bad>drift {b.drift_rows}</span> ({_prose(why)})"
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
    from reconcile.standing import rows_text, with_rows

    lines = [
        f"<br><span class=small>Delta v{w.version}: {e(w.operation)} by {_writer(w.engine, w.user)}, "
        f"<span class=nw>{e(rows_text(w))}</span>"
        + (f", {_time(w.timestamp)}" if w.timestamp is not None else "")
        + "</span>"
        for w in with_rows(ShardTable(cfg), writers)
    ]
    if count > len(writers):
        lines.append(f"<br><span class=small>and {count - len(writers)} more foreign versions</span>")
    return "".join(lines)


def _writer(engine: str, user) -> str:
    """Who wrote a foreign Delta version: its engine, and its user when the commit names one."""
    name = " ".join(f"<span class=nw>{e(part)}</span>" for part in engine.split())  # a break only between words
    return name + (f", user <span class=nw>{e(str(user))}</span>" if user else "")


def _unrepaired(ledger, cfg: SinkConfig) -> str:
    """The foreign Delta versions no committed batch repaired yet (``status``'s
    ``foreign_unrepaired``, :func:`reconcile.report.foreign_unrepaired`), in red: each with who
    wrote it, its rows, when, and that the next batch repairs it (or why it cannot). Shown first
    on a sink's page; once a batch repaired them they are its drift, grey, in the ledger."""
    from reconcile.report import foreign_unrepaired
    from reconcile.standing import rows_text

    try:
        found = foreign_unrepaired(ledger, cfg.name)
    except Exception as exc:  # noqa: BLE001 - the page still shows the ledger
        found, why = None, f": {str(exc)[:200]}"
    else:
        why = ""
    if found is None:
        return f"<p class=warn>foreign writes unknown: the shard's Delta log cannot be read{e(why)}</p>"
    if not found:
        return ""
    rows = [
        f"<tr class=unrepaired><td class='bad n'>{f['version']}</td>"
        f"<td class=bad>{e(f['operation'])} by {_writer(f['engine'], f['user'])}<br>{_time(f['timestamp'])}</td>"
        f"<td class='bad n'>{e(rows_text(f))}</td><td class='bad msg'>{_prose(f['why'] or 'not yet repaired')}</td></tr>"
        for f in found[:FOREIGN_SHOWN]
    ]
    more = len(found) - FOREIGN_SHOWN
    return (
        f"<section id=unrepaired><h2 class=bad>Drift not yet repaired: {len(found)} foreign Delta version(s)</h2>"
        "<p class=small>written to the shard by another writer after the last batch read it</p>"
        + _table(["Delta version", "written (UTC)", "rows", "repair"], rows)
        + (
            f"<p class=bad>and {more} more foreign versions (`python -m reconcile status {e(cfg.name)}` lists them)</p>"
            if more > 0
            else ""
        )
        + "</section>"
    )


def _charts(committed: list, now: int, shard_upper: int, threshold: int | None) -> str:
    """The three charts of a sink's page over its newest committed batches (oldest first)."""
    at = sorted(((to_millis(b.updated_at) if b.updated_at else b.upper, b) for b in committed), key=lambda p: p[0])
    return (
        svg_lines(
            "upper at each commit, as lag behind now",
            "x: commit time, UTC; y: now − upper",
            {f"now − upper (the lag now: {duration(now - shard_upper)})": (BLUE, [(t, now - b.upper) for t, b in at])},
            from_zero=False,
        )
        + svg_lines(
            "lag at each commit",
            "x: commit time, UTC; y: commit time − upper",
            {"commit time − upper": (BLUE, [(t, t - b.upper) for t, b in at])},
            threshold,
        )
        + svg_bars("rows per batch", committed)
    )


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _current_line(cfg: SinkConfig, ledger) -> str:
    """The current-state table's line: its name, the upper it reflects; red while it lags the
    shard or holds a foreign commit (the next append mends both)."""
    from reconcile.model import COMMITTED
    from reconcile.sink.current import describe
    from reconcile.storage.delta import ShardTable

    try:
        d = describe(cfg, ShardTable(cfg), ledger.batches(cfg.name, (COMMITTED,)))
    except Exception as exc:  # noqa: BLE001 - the page still shows the ledger
        return f"<p class=bad>current table: unreadable ({e(str(exc)[:200])})</p>"
    if d is None:
        return ""
    head = f"current table {e(d['name'])} <span class=small>({e(d['path'])})</span>: "
    if not d["exists"]:
        return f"<p>{head}not created yet (the next append creates it)</p>"
    text = f"reflects shard version {d['shard_version']} (upper {_time(d['upper'])}), {d['rows']} rows"
    late = []
    if d["behind"]:
        late.append(f"behind the shard's version {d['shard_latest_version']}: the next append completes it")
    if d["foreign_versions"]:
        late.append(f"foreign commits {d['foreign_versions']}: the next append rebuilds it")
    if late:
        return f"<p>{head}{text}; <span class=bad>{_prose('; '.join(late))}</span></p>"
    return f"<p>{head}{text}</p>"


def render_sink(name: str, before: tuple[int, str] | None = None, dag_url: str = "/dags") -> str:
    """One sink's page: charts (first page only), then ``PAGE`` ledger rows newest first,
    older than the (lower, batch id) key ``before``."""
    from reconcile import settings
    from reconcile.config_loading import load_sink
    from reconcile.errors import SinkError
    from reconcile.manifest import source_versions
    from reconcile.model import COMMITTED, OPEN_STATES, SUPERSEDED
    from reconcile.report import refresh_of, source_text
    from reconcile.storage.ledger import Ledger

    cfg = load_sink(name)
    ledger = Ledger(settings.metadata_url())
    try:
        try:
            shard = ledger.get_shard(cfg.name)
        except SinkError:
            return _page(
                f"{cfg.name}: reconcile shard",
                f"<p><a href='../'>all shards</a></p><h1>{e(cfg.name)}</h1><p>no shard yet (no run minted)</p>",
            )
        unrepaired = _unrepaired(ledger, cfg)
        page = ledger.batch_page(cfg.name, before=before, limit=PAGE)
        newest = ledger.batch_page(cfg.name, limit=CHART_BATCHES) if before is None else []
        previous = {b.batch_id: ledger.previous_committed(cfg.name, b.lower) for b in page if b.drift_rows}
        committed_all = ledger.batches(cfg.name, (COMMITTED,)) if previous else []
        left = _behind(cfg.name, ledger.batches(cfg.name, (SUPERSEDED, *OPEN_STATES)), shard.upper)
        current = _current_line(cfg, ledger) if cfg.current is not None else ""
    finally:
        ledger.dispose()
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
        read = source_versions(b.manifest)
        way = refresh_of(b.manifest)
        said = [f"read {source_text(read)}"] if read else []
        said += [way["text"]] if way else []
        sources = f"<br><span class=small>{e('; '.join(said))}</span>" if said else ""
        rows.append(
            f"<tr><td>[{_time(b.lower)},<br>{_time(b.upper)}){sources}</td><td class=msg>{_state(b, shard.upper)}</td>"
            f"<td class=n>{_count(b.delta_version)}</td><td class=n>{_count(b.rows_ok)}</td>"
            f"<td class=n>{_count(b.rows_err)}</td><td{' class=drift' if b.drift_rows else ''}>{drift}</td>"
            f"<td><span class='small nw'>{e(b.run_id or '-')}</span><br>{links}</td></tr>"
        )
    nav = []
    if before is not None:
        nav.append("<a href='?'>newest batches</a>")
    if len(page) == PAGE:
        nav.append(f"<a href='?before={page[-1].lower}:{quote(page[-1].batch_id, safe='')}'>older batches</a>")
    head = (
        f"<p><a href='../'>all shards</a></p><h1>{e(cfg.name)} <span class=small>({e(cfg.kind)})</span></h1>"
        f"<p>upper {_time(shard.upper)} · since {_time(shard.since) if shard.since else 'never compacted'} · "
        f"read-only {'yes' if shard.read_only else 'no'} · Delta version {shard.delta_version}</p>"
        f"{unrepaired}{left}{current}"
    )
    older = f"<p class=small>batches before lower {_time(before[0])}</p>" if before else ""
    return _page(
        f"{cfg.name}: reconcile shard",
        head
        + (charts if before is None else "")
        + f"<h2>Ledger</h2>{older}"
        + _table(["batch [lower, upper) UTC", "state / cause", "version", "ok", "errors", "drift", "run"], rows)
        + f"<p>{' · '.join(nav)}</p>",
    )
