"""A thousand sinks in one Airflow (issue 50): the fleet's sink files, :func:`write_sinks` (query,
upsert and change-log sinks in turn, hourly, some with a lag alert, a correction guard or a
current-state table), as the tests and the benchmark generate them."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "include"))

KINDS = ("query", "upsert", "changelog")
START = "2026-01-01T00:00:00Z"


def sink_text(name: str, kind: str, i: int, data: str = "${RECONCILE_HOME}/fleet-data", start: str = START) -> str:
    """One sink file as a team writes it (comments, a description, a schema of six columns):
    an hourly ``kind`` sink reading ``data``/``name``; every fifth with a lag alert, every
    seventh with a current-state table, every eleventh with a correction guard."""
    extra = ""
    if i % 5 == 0:
        extra += "alert:\n  lag_minutes: 180\n"
    if i % 7 == 0:
        extra += "current: true\n"
    if i % 11 == 0:
        extra += "correction_guard:\n  max_share: 0.2\n  min_rows: 1000\n"
    head = (
        f"# {name}: owned by team {i % 40}; generated for the fleet benchmark (bench/fleet.py)\n"
        f"name: {name}\nkind: {kind}\n"
        f"description: Sink {i} of the fleet, a {kind} sink kept hourly for team {i % 40}.\n"
        "schema:\n"
        "  - {name: id, type: bigint, nullable: false}\n"
        "  - {name: customer, type: string}\n"
        "  - {name: amount, type: 'decimal(12,2)'}\n"
        "  - {name: status, type: string}\n"
        "  - {name: created, type: timestamp}\n"
        "  - {name: region, type: string}\n"
        f"partitions: {partitions_of(i)}\nschedule: '@hourly'\nstart_date: {start}\ncatchup: false\nretries: 2\n"
        f"compaction:\n  every_batches: 50\nretention:\n  vacuum_hours: 168\n  history_hours: 336\n"
    )
    src = f"{data}/{name}"
    if kind == "query":
        body = (
            "query:\n  sources:\n"
            f"    orders: {{format: parquet, path: '{src}/orders'}}\n"
            f"    customers: {{format: parquet, path: '{src}/customers'}}\n"
            "  sql: |\n"
            "    SELECT o.id, c.name AS customer, o.amount, o.status, o.created, c.region\n"
            "    FROM orders o JOIN customers c ON o.customer_id = c.id\n"
            "    WHERE o.status <> 'void'\n"
        )
    elif kind == "upsert":
        body = (
            f"upsert:\n  source: {{format: parquet, path: '{src}/commands'}}\n"
            "  key: id\n  time_column: at\n  offset_column: offset\n"
            "  delete: {column: op, values: [delete, purge]}\n"
        )
    else:
        body = (
            f"changelog:\n  source: {{format: parquet, path: '{src}/changes'}}\n"
            "  time_column: changed_at\n  diff_column: diff\n"
        )
    return head + extra + body


def partitions_of(i: int) -> int:
    """Sink ``i``'s hash partitions."""
    return 4 + i % 4


def write_sinks(directory: Path, count: int, prefix: str = "fleet", start: str = START) -> list[str]:
    """``count`` sink files ``<prefix>_<i>.yaml`` in ``directory`` (:func:`sink_text`, the kinds
    in turn, from ``start``): their names."""
    directory.mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(count):
        name = f"{prefix}_{i:04d}"
        (directory / f"{name}.yaml").write_text(sink_text(name, KINDS[i % 3], i, start=start))
        names.append(name)
    return names
