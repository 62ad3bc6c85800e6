"""The shard overview page (served inside Airflow's api-server by plugins/reconcile_plugin.py).

One table: every configured sink's shard with its frontiers, lag behind now, read-only flag and
its last batches (state, Delta version, rows, drift). Reads the metadata table per request.
"""

from __future__ import annotations

import html
from datetime import UTC, datetime


def _ts(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _lag(ms: int) -> str:
    seconds = max(0, int(datetime.now(UTC).timestamp() - ms / 1000))
    days, rest = divmod(seconds, 86400)
    return f"{days}d {rest // 3600}h {rest % 3600 // 60}m"


def render_overview(limit: int = 5) -> str:
    from reconcile import settings
    from reconcile.config import load_dir
    from reconcile.errors import SinkError
    from reconcile.storage.ledger import MetadataStore

    configs, errors = load_dir()
    rows = []
    store = MetadataStore(settings.metadata_url())
    try:
        for cfg in configs:
            e = html.escape
            try:
                shard = store.get_shard(cfg.name)
            except SinkError:
                rows.append(f"<tr><td>{e(cfg.name)}</td><td colspan=6>no shard yet (no run has minted)</td></tr>")
                continue
            batches = store.batches(cfg.name)[-limit:]
            last = "<br>".join(
                f"[{_ts(b.lower)}, {_ts(b.upper)}) {e(b.state)} v{b.delta_version if b.delta_version is not None else '-'} "
                f"ok={b.rows_ok if b.rows_ok is not None else '-'} err={b.rows_err if b.rows_err is not None else '-'} "
                f"drift={b.drift_rows if b.drift_rows is not None else '-'}"
                for b in reversed(batches)
            )
            rows.append(
                f"<tr><td>{e(cfg.name)}</td><td>{e(cfg.kind)}</td><td>{_ts(shard.upper)}</td>"
                f"<td>{_lag(shard.upper)}</td><td>{_ts(shard.since)}</td><td>{'yes' if shard.read_only else 'no'}</td>"
                f"<td>{last}</td></tr>"
            )
    finally:
        store.dispose()
    bad = "".join(f"<li>{html.escape(str(err))}</li>" for err in errors)
    return (
        "<!doctype html><html><head><meta charset=utf-8><title>Reconcile shards</title>"
        "<style>body{font-family:sans-serif}td,th{border:1px solid #ccc;padding:4px;vertical-align:top}"
        "table{border-collapse:collapse}</style></head><body><h1>Reconcile shards</h1>"
        "<table><tr><th>sink</th><th>kind</th><th>upper (UTC)</th><th>lag</th><th>since</th>"
        f"<th>read-only</th><th>last batches</th></tr>{''.join(rows)}</table>"
        + (f"<h2>Invalid sink configs</h2><ul>{bad}</ul>" if bad else "")
        + "</body></html>"
    )
