"""The keys an upsert batch can touch, bounded by its feed's statistics (issue 49): a batch reads
only the shard's files whose key range can hold one of them.

The shard's files are laid out by key (sorted within each hash partition of the key, cut every
``layout.ROWS_PER_FILE`` rows), so each file's key statistics bound a narrow range. The batch's
keys are bounded without reading a row where the feed has statistics: a Parquet or Delta feed's
row groups (or files) whose time and offset statistics say every command in them is applied are
left out, exactly as the batch's own read leaves them out (``upsert.could_apply``), and the key
ranges of the others are merged (:func:`feed_key_ranges`). Where the feed has no statistics
(JSON, CSV, a key that is not an integer), the batch's distinct keys are collected by one small
Spark job instead (``kinds.upsert._files_of_keys``, which gets :func:`feed_key_ranges` through
``Bounds.feed_key_ranges``: the kinds do no I/O of their own).
"""

from __future__ import annotations

from typing import Any

from reconcile.config import Source

# Past this many feed files, their footers are not read (the batch's keys are collected instead).
MAX_FEED_FILES = 2_000


def merged(ranges: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Sorted, overlapping ranges merged: disjoint ``(lo, hi)`` in ascending order."""
    out: list[tuple[Any, Any]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _unit_ranges(units: list[dict], key: str, time: str, offset: str, lower: int, watermark: int) -> list | None:
    """The key ranges of the units (row groups or files: ``{column: (min, max, nulls, rows)}``)
    that may hold a command no batch applied; None where a needed statistic is missing."""
    out = []
    for u in units:
        t, o, k = u.get(time), u.get(offset), u.get(key)
        if t is None or o is None or k is None:
            return None
        applied = t[2] == 0 and o[2] == 0 and t[1] is not None and o[1] is not None
        if applied and t[1] < lower and o[1] <= watermark:
            continue  # every command in it is older than lower and at or below the watermark
        if k[2] == k[3]:
            continue  # only null keys: commands that cannot be keyed touch no key
        if k[0] is None or k[1] is None:
            return None
        out.append((k[0], k[1]))
    return out


def _parquet_units(path: str, columns: list[str]) -> list[dict] | None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from reconcile.storage.files import fs_of, list_files

    found = list_files(path)
    if len(found) > MAX_FEED_FILES:
        return None
    fs, root = fs_of(path)
    units = []
    for rel in sorted(found):
        if not rel.endswith(".parquet"):
            continue
        with fs.open(f"{root.rstrip('/')}/{rel}", "rb") as f:
            meta = pq.ParquetFile(f).metadata
        schema = meta.schema.to_arrow_schema()
        idx = {n.lower(): i for i, n in enumerate(schema.names)}
        if any(c.lower() not in idx or not pa.types.is_integer(schema.field(idx[c.lower()]).type) for c in columns):
            return None
        for rg in range(meta.num_row_groups):
            group = meta.row_group(rg)
            unit = {}
            for c in columns:
                st = group.column(idx[c.lower()]).statistics
                if st is None or not st.has_null_count:
                    return None
                lo, hi = (st.min, st.max) if st.has_min_max else (None, None)
                unit[c] = (lo, hi, st.null_count, group.num_rows)
            units.append(unit)
    return units


def _delta_units(path: str, columns: list[str]) -> list[dict] | None:
    from deltalake import DeltaTable

    adds = DeltaTable(path.removeprefix("file:")).get_add_actions(flatten=True)
    names = set(adds.column_names)
    if any(f"min.{c}" not in names or f"null_count.{c}" not in names for c in columns):
        return None
    rows = adds.column("num_records").to_pylist()
    got = {c: [adds.column(f"{s}.{c}").to_pylist() for s in ("min", "max", "null_count")] for c in columns}
    units = []
    for i, n in enumerate(rows):
        units.append({c: (got[c][0][i], got[c][1][i], got[c][2][i], n) for c in columns})
    return units


def feed_key_ranges(
    src: Source, key: str, time: str, offset: str, lower: int, watermark: int | None
) -> list[tuple[Any, Any]] | None:
    """The ranges of ``key`` (merged, ascending; empty: no command to apply) that hold every key
    a batch ``[lower, ...)`` can touch, from the statistics of the feed ``src`` (its ``time`` and
    ``offset`` columns) alone; None where they are not known (a feed format without statistics, a
    source read with options, no watermark yet, a column that is not an integer, a file without
    statistics)."""
    if watermark is None or src.format not in ("parquet", "delta") or dict(src.options):
        return None
    columns = [key, time, offset]
    try:
        if src.format == "parquet":
            units = _parquet_units(src.path, columns)
        elif "://" not in src.path or src.path.startswith("file:"):
            units = _delta_units(src.path, columns)
        else:
            return None
    except Exception:  # noqa: BLE001 - statistics are an optimisation: the batch reads the shard whole
        return None
    if units is None:
        return None
    ranges = _unit_ranges(units, key, time, offset, lower, watermark)
    return None if ranges is None else merged(ranges)
