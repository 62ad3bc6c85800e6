"""What an operator reads about a shard: its status (frontiers and last batches), its contents as
of a time, and the one way every output writes a time. Used by the CLI, the demo and the pages.

Times: every output shows a time (epoch ms) as ISO UTC with the ms beside it
(``2026-11-24T09:00:00.000Z (1795510800000)``, :func:`reconcile.log.iso`); JSON holds it as
``{"ms": ..., "iso": ...}`` (:func:`stamp`); a page sets the ms in small type
(:func:`iso_parts`); a lag reads ``1d 2h 3m`` (:func:`duration`).
"""

from __future__ import annotations

from reconcile.errors import SinkError
from reconcile.log import iso

# -- times ----------------------------------------------------------------------------------------


def iso_parts(ms: int | None) -> tuple[str, str]:
    """A time as :func:`~reconcile.log.iso` writes it, split into the ISO text and the ``(ms)``."""
    text, _, millis = iso(ms).partition(" ")
    return text, millis


def iso_text(ms: int | None) -> str:
    """The ISO UTC text of a time, without the ms beside it."""
    return iso_parts(ms)[0]


def stamp(ms: int | None) -> dict | None:
    """A time in JSON: ``{"ms": epoch ms, "iso": ISO UTC}`` (None stays None)."""
    return None if ms is None else {"ms": ms, "iso": iso_text(ms)}


def duration(ms: int) -> str:
    """A span of time in whole minutes: ``2h 5m``, or ``1d 2h 5m`` from a day on."""
    minutes = max(0, ms) // 60_000
    days, rest = divmod(minutes, 1440)
    return f"{days}d {rest // 60}h {rest % 60}m" if days else f"{rest // 60}h {rest % 60}m"


# -- status ---------------------------------------------------------------------------------------


def status_data(store, name: str, limit: int = 10) -> dict:
    """A shard's frontiers and its last ``limit`` batches (oldest first), as ``status --json``
    prints them: each time as ``{"ms": epoch ms, "iso": ISO UTC}``."""
    shard = store.get_shard(name)
    return {
        "sink": name,
        "upper": stamp(shard.upper),
        "since": stamp(shard.since),
        "as_of": stamp(shard.as_of),
        "read_only": shard.read_only,
        "delta_version": shard.delta_version,
        "batches": [
            {
                "batch_id": b.batch_id,
                "lower": stamp(b.lower),
                "upper": stamp(b.upper),
                "state": b.state,
                "delta_version": b.delta_version,
                "rows_ok": b.rows_ok,
                "rows_err": b.rows_err,
                "rows_net": b.rows_net,
                "drift_rows": b.drift_rows,
                "late_commands": b.late_commands,
                "source_offset": b.source_offset,
                "failure_kind": b.failure_kind,
                "message": b.message,
                "approved": b.approved,
                "run_id": b.run_id,
                "updated_at": b.updated_at.isoformat() if b.updated_at else None,
            }
            for b in store.batches(name)[-limit:]
        ],
    }


def print_status(store, name: str, limit: int = 10) -> None:
    data = status_data(store, name, limit)
    print(
        f"shard {name}: upper={iso(data['upper']['ms'])} "
        f"since={iso(data['since']['ms']) if data['since']['ms'] else 'never compacted'} "
        f"as_of={iso(data['as_of']['ms'])} read_only={data['read_only']} delta_version={data['delta_version']}"
    )
    batches = data["batches"]
    feed = any(b["source_offset"] is not None or b["late_commands"] is not None for b in batches)

    def cell(v, width: int) -> str:
        return f"{'-' if v is None else v!s:>{width}}"

    if batches:
        print(
            f"  {'lower (UTC, ms)':<40} {'upper (UTC, ms)':<40} {'state':<10} {'version':>7} {'ok':>6} {'err':>5} "
            f"{'drift':>6}" + (f" {'late':>5} {'offset':>10}" if feed else "") + "  run / cause"
        )
    for b in batches:
        print(
            f"  {iso(b['lower']['ms']):<40} {iso(b['upper']['ms']):<40} {b['state']:<10} {cell(b['delta_version'], 7)} "
            f"{cell(b['rows_ok'], 6)} {cell(b['rows_err'], 5)} {cell(b['drift_rows'], 6)}"
            + (f" {cell(b['late_commands'], 5)} {cell(b['source_offset'], 10)}" if feed else "")
            + f"  {b['run_id']}"
        )
        if b["message"]:
            kind = f"{b['failure_kind']}: " if b["failure_kind"] else ""
            print(f"      {kind}{b['message']}")
        if b["approved"]:
            print(f"      approved past the correction guard by {b['approved']}")


# -- contents -------------------------------------------------------------------------------------


def show_shard(spark, store, cfg, as_of: int | None, *, log: bool, errors: bool, limit: int) -> None:
    """Print the shard as of ``as_of`` (default upper - 1), its error rows, or its update log."""
    from reconcile.storage import frames
    from reconcile.storage.delta import ShardTable

    table = ShardTable(cfg)
    updates = frames.read_updates(spark, table)
    if log:
        print(f"update log of {cfg.name} (row, _error, _time, _diff):")
        updates.orderBy("_time", *cfg.column_names).show(limit, truncate=False)
        return
    shard = store.get_shard(cfg.name)
    t = as_of if as_of is not None else shard.upper - 1
    if t < shard.since:
        raise SinkError(
            f"as of {iso(t)} is before the shard's since {iso(shard.since)}: not readable exactly", sink=cfg.name
        )
    ok, errs = frames.read_as_of(spark, table, t)
    if errors:
        print(f"errors of {cfg.name} as of {iso(t)}:")
        errs.withColumnRenamed("_count", "count").show(limit, truncate=False)
    else:
        print(f"{cfg.name} as of {iso(t)} (count = multiplicity):")
        ok.withColumnRenamed("_count", "count").orderBy(*cfg.column_names).show(limit, truncate=False)
