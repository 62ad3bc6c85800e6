"""Printing a shard's history and diff reports (what :func:`reconcile.sink.history.history_report`
and :func:`~reconcile.sink.history.diff_report` return) as ``history`` and ``diff`` show them: a
text table, or JSON."""

from __future__ import annotations

import json
from typing import Any

from reconcile.config import SinkConfig
from reconcile.log import iso
from reconcile.report import source_text
from reconcile.sink.history import output_names


def _cell(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, dict) and "ms" in v:
        return iso(v["ms"])
    return str(v)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in [header, *rows]
    ]


def to_json(report: dict) -> str:
    return json.dumps(report, indent=2, default=str)


def print_history(cfg: SinkConfig, report: dict) -> None:
    n = output_names(cfg)
    at = f", the versions valid as of {iso(report['as_of']['ms'])}" if report["as_of"] else ""
    what = "error rows' history" if report["per"] == "error row" else f"type-2 history per {report['per']}"
    print(
        f"{cfg.name} ({cfg.kind}): {what}{at}; valid_from inclusive, valid_to exclusive ('current': still valid "
        f"at upper - 1, upper {iso(report['upper']['ms'])}); error rows {'only' if report['per'] == 'error row' else 'left out (--errors)'}"
    )
    for note in [report["note"], *report["notes"]]:
        if note:
            print(f"note: {note}")
    versions = report["versions"]
    if not versions:
        print("  (no versions)")
        return
    cols = [c for c in versions[0] if c not in (n["valid_from"], n["valid_to"])]
    header = [*cols, n["valid_from"], n["valid_to"]]
    body = [
        [
            *(_cell(v[c]) for c in cols),
            _cell(v[n["valid_from"]]),
            _cell(v[n["valid_to"]]) if v[n["valid_to"]] else "current",
        ]
        for v in versions
    ]
    for line in _table(header, body):
        print(line)
    if report["truncated"]:
        print(f"  (first {len(versions)} versions; --limit shows more)")
    for read in report.get("sources") or []:
        way = f"; {read['refresh']}" if read.get("refresh") else ""
        print(f"  the batch at {iso(read['time']['ms'])} read {source_text(read['sources'])}{way}")


def print_diff(cfg: SinkConfig, report: dict) -> None:
    name = output_names(cfg)["diff"]
    kind = "error row(s)" if report["errors"] else "row(s)"
    a, r = report["added"], report["removed"]
    print(
        f"{cfg.name}: changes from {iso(report['from']['ms'])} (exclusive) to {iso(report['to']['ms'])} (inclusive): "
        f"{a['rows']} {kind} added (count {a['count']}), {r['rows']} removed (count {r['count']})"
    )
    if not report["errors"] and report["error_rows_changed"]:
        print(f"  and {report['error_rows_changed']} error row(s) changed (--errors lists them)")
    for note in report["notes"]:
        print(f"note: {note}")
    changes = report["changes"]
    if not changes:
        return
    cols = [c for c in changes[0] if c != name]
    body = [[f"{'+' if c[name] > 0 else ''}{c[name]}", *(_cell(c[k]) for k in cols)] for c in changes]
    for line in _table([name, *cols], body):
        print(line)
    if report["truncated"]:
        print(f"  (first {len(changes)} changes; --limit shows more)")
