"""A thousand sinks in one Airflow (issue 50): the fleet, as the tests and the benchmark build it.

- :func:`write_sinks`: the sink files (query, upsert and change-log sinks in turn, hourly, some
  with a lag alert, a correction guard or a current-state table);
- :func:`fill_ledger`: each sink's batches written straight into the ledger through its own API
  (``Ledger.mint`` -> ``mark_staged`` -> ``absorb_commit``, as the stages do; the older ones in
  bulk as the API leaves them), a few sinks left needing action (:func:`scenario`).
"""

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


HOUR = 3_600_000
TAIL = 5  # each sink's newest batches written through the ledger's API (the rest in bulk)
LATE_HOURS = 30  # a late sink's upper lags now by this much


def scenario(i: int) -> str:
    """What sink ``i`` of the fleet is left as: ``failed`` (its newest batch's write failed for
    good), ``late`` (its upper :data:`LATE_HOURS` behind now), ``behind`` (a superseded run's
    wider batch left it behind), else ``ok``."""
    return "failed" if i % 97 == 3 else "late" if i % 89 == 5 else "behind" if i % 83 == 7 else "ok"


def manifest_text(batch_id: str, lower: int, partitions: int, stage_id: str, rows: int) -> str:
    """A manifest as a write records it (:class:`reconcile.manifest.Manifest`: a file with its
    size and digest, rows and checksums per hash partition)."""
    from reconcile.manifest import Manifest, Part

    parts = {
        p: Part(
            rows=rows // partitions,
            checksum=f"{(lower * 31 + p) % 2**61:x}",
            err=0,
            weight=rows // partitions,
            net=0,
            files={f"part-{p:05d}-{stage_id}.parquet": 4096 + p},
            digests={f"part-{p:05d}-{stage_id}.parquet": f"{(lower * 7 + p) % 2**64:016x}"},
            desired_checksum=f"{(lower * 13 + p) % 2**61:x}",
            shard_checksum=f"{(lower * 17 + p) % 2**61:x}",
        )
        for p in range(partitions)
    }
    return Manifest(batch_id, lower, lower + HOUR, partitions, parts, stage_id=stage_id).to_json()


def fill_ledger(url: str, names: list[str], batches: int, as_of: int) -> dict[str, str]:
    """``batches`` hourly batches of each sink from ``as_of``, as its runs leave them: all but the
    newest :data:`TAIL` inserted in bulk as the rows the ledger's API leaves (committed, each at
    the Delta version after the one it read: at 12-18 ms a batch the API would take hours for a
    million), the newest through the API itself (``Ledger.mint`` with the mint's rules,
    ``mark_staged``, ``absorb_commit``); then each sink's :func:`scenario` (a failed, late or
    behind sink has its last batches left out, its upper before ``as_of + batches`` hours).
    Returns {sink: its scenario}."""
    import uuid
    from datetime import UTC, datetime

    from sqlalchemy import insert, update

    from reconcile.model import FINAL, CommitRecord, Staged
    from reconcile.sink.mint import decide
    from reconcile.storage.ledger import Ledger
    from reconcile.storage.ledger_rows import Batch, Shard

    ledger = Ledger(url)
    fate = {}
    try:
        for i, name in enumerate(names):
            fate[name] = scenario(i)
            n = batches - {"late": LATE_HOURS, "behind": 2, "failed": 1}.get(fate[name], 0)
            bulk = max(0, n - TAIL)
            parts = partitions_of(i)
            ledger.ensure_shard(name, as_of)
            t = datetime.now(UTC)
            rows = []
            for j in range(bulk):
                lower = as_of + j * HOUR
                batch_id, stage = f"{lower}-{uuid.uuid4().hex[:16]}", uuid.uuid4().hex[:12]
                rows.append(
                    dict(
                        batch_id=batch_id, shard=name, lower=lower, upper=lower + HOUR, state="committed",
                        run_id=f"scheduled__{lower}", attempt=1, delta_version=j + 1, read_version=j,
                        rows_ok=1000 + j % 50, rows_err=0, drift_rows=0, stage_id=stage, rows_net=j % 7,
                        manifest=manifest_text(batch_id, lower, parts, stage, 1000 + j % 50),
                        created_at=t, updated_at=t,
                    )
                )  # fmt: skip
            with ledger.tx() as s:
                if rows:
                    s.execute(insert(Batch), rows)
                s.execute(
                    update(Shard)
                    .where(Shard.name == name)
                    .values(upper=as_of + bulk * HOUR, delta_version=bulk, updated_at=t)
                )
            for j in range(bulk, n):
                _api_batch(ledger, name, as_of + j * HOUR, j, parts, decide, Staged, CommitRecord)
            lower = as_of + n * HOUR
            if fate[name] == "failed":  # its next run's write fails for good
                d = ledger.mint(name, lambda sh, op, lo=lower: decide(sh, op, f"scheduled__{lo}", 1, lo + HOUR, False))
                ledger.note_failure(
                    d.new.batch_id,
                    f"source path {name}/orders does not exist. Remedy: restore the source, then clear the run.",
                    FINAL,
                )
            elif fate[name] == "behind":  # a wide run superseded by a narrower one that committed
                ledger.mint(name, lambda sh, op, lo=lower: decide(sh, op, f"manual__{lo}", 1, lo + 2 * HOUR, False))
                _api_batch(ledger, name, lower, n, parts, decide, Staged, CommitRecord, run=f"backfill__{lower}")
    finally:
        ledger.dispose()
    return fate


def _api_batch(ledger, name, lower, j, parts, decide, Staged, CommitRecord, run=None) -> None:
    """One batch through the ledger's API, as mint, write and append record it."""
    run = run or f"scheduled__{lower}"
    d = ledger.mint(name, lambda shard, open_: decide(shard, open_, run, 1, lower + HOUR, False))
    b = d.new
    stage = f"s{j:010d}"
    text = manifest_text(b.batch_id, lower, parts, stage, 1000)
    ledger.mark_staged(b.batch_id, Staged(stage, text, 1000, 0, j, 0, rows_net=0), replaces=None)
    ledger.absorb_commit(name, CommitRecord(j + 1, b.batch_id, b.lower, b.upper, run, 1000, 0, None, stage))
