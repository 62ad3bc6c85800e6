"""Delta's per-file statistics of a Parquet file, read from its footer (no row is read): what a
metadata-only commit records for each staged file so that readers can skip files."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

from reconcile.storage.files import fs_of

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _json_value(value: Any, kind: str, upper: bool) -> Any:
    """A Parquet statistic as Delta's stats JSON holds it; None where no exact, safe bound is
    known (then readers do not skip on that column: correct, only slower)."""
    if isinstance(value, bool) or value is None:
        return None
    if kind == "int" and isinstance(value, int):
        return value
    if kind == "date" and isinstance(value, date) and not isinstance(value, datetime):
        return value.isoformat()
    if kind == "timestamp" and isinstance(value, datetime):
        # Delta keeps timestamp statistics in milliseconds: round the bound outwards.
        v = value if value.tzinfo else value.replace(tzinfo=UTC)
        us = (v - _EPOCH) // timedelta(microseconds=1)
        ms = -((-us) // 1000) if upper else us // 1000
        try:
            bound = _EPOCH + timedelta(milliseconds=ms)
            return bound.replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"
        except OverflowError:  # rounded past year 9999: no bound
            return None
    return None


def _stat_kind(arrow_type) -> str | None:
    import pyarrow as pa

    if pa.types.is_integer(arrow_type):
        return "int"
    if pa.types.is_date32(arrow_type):
        return "date"
    if pa.types.is_timestamp(arrow_type):
        return "timestamp"
    return None


def file_stats(path: str) -> dict:
    """Delta's statistics of one Parquet file (``numRecords``, and ``nullCount``/``minValues``/
    ``maxValues`` per top-level column where the footer gives them exactly), from its footer."""
    import pyarrow.parquet as pq

    fs, p = fs_of(path)
    with fs.open(p, "rb") as f:
        meta = pq.ParquetFile(f).metadata
        schema = pq.ParquetFile(f).schema_arrow
    stats: dict[str, Any] = {"numRecords": meta.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    for i, field in enumerate(schema):
        kind = _stat_kind(field.type)
        nulls, lo, hi, exact = 0, None, None, True
        for rg in range(meta.num_row_groups):
            col = meta.row_group(rg).column(i).statistics
            if col is None or not col.has_null_count:
                exact = False
                break
            nulls += col.null_count
            if kind and col.has_min_max:
                lo = col.min if lo is None else min(lo, col.min)
                hi = col.max if hi is None else max(hi, col.max)
        if not exact:
            continue
        stats["nullCount"][field.name] = nulls
        if kind and lo is not None and nulls < meta.num_rows:
            lo_j, hi_j = _json_value(lo, kind, False), _json_value(hi, kind, True)
            if lo_j is not None and hi_j is not None:
                stats["minValues"][field.name], stats["maxValues"][field.name] = lo_j, hi_j
    return stats
