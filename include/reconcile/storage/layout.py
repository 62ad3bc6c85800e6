"""Where a shard's files live under the warehouse root (a local folder or any fsspec URI)::

    <warehouse>/<sink>/                                       Delta table: sink columns, _time, _diff, _error
    <warehouse>/<sink>/_delta_log/                            its log
    <warehouse>/<sink>/batches/<batch_id>/<stage_id>/reconcile_part=<p>/*.parquet
                                                              one write attempt's correction
    <warehouse>/<sink>/compactions/<read_version>-<token>/*.parquet
                                                              one compaction's rewrite

Every write attempt stages into a directory of its own (``stage_id``) inside the table's
directory; the ledger's manifest names the one attempt whose files are the batch, and the
append commits exactly those files to the Delta log as they are. Every compaction writes its
rewrite into a directory of its own, named after the Delta version it read: it can only be
committed as the version right after that one.
"""

from __future__ import annotations

import uuid

BATCHES_DIR = "batches"
COMPACTIONS_DIR = "compactions"
PART_COLUMN = "reconcile_part"  # the staged files' hash-partition directory: reconcile_part=<p>/
# An upsert shard's files are sorted by key in each hash partition of the key and cut every this
# many rows, so that each file's key statistics bound a narrow range of keys: a batch reads only
# the files whose range holds one of its keys (reconcile.kinds.upsert).
ROWS_PER_FILE = 32_768


def new_stage_id() -> str:
    """A fresh write attempt's directory name."""
    return f"w-{uuid.uuid4().hex[:16]}"


def staged_relative(batch_id: str, stage_id: str, rel: str) -> str:
    """A staged file's path relative to the table, as its Delta ``add`` action names it."""
    return f"{BATCHES_DIR}/{batch_id}/{stage_id}/{rel}"


def compaction_dir(read_version: int, token: str) -> str:
    """A compaction's directory name: the Delta version it read, then its token."""
    return f"{read_version}-{token}"


def parse_compaction_dir(name: str) -> tuple[int, str] | None:
    """(read version, token) of a compaction's directory name; None for any other name."""
    version, sep, token = name.partition("-")
    return (int(version), token) if sep and version.isdigit() and token else None


def part_of(path: str) -> int | None:
    """The hash partition a staged file belongs to (its ``reconcile_part=<p>`` directory)."""
    for seg in path.split("/"):
        if seg.startswith(PART_COLUMN + "="):
            return int(seg.split("=", 1)[1])
    return None
