"""The shard's Delta log and files, without a JVM: what the control plane (mint, sync, append,
compaction_due, status, check) needs, in plain Python (delta-rs for table snapshots and the
batch commit, fsspec for files, pyarrow for Parquet footers).

Layout under the warehouse root (a local folder or any fsspec URI)::

    <warehouse>/<sink>/                                       Delta table: sink columns, _error, _time, _diff
    <warehouse>/<sink>/batches/<batch_id>/<stage_id>/reconcile_part=<p>/*.parquet
                                                              one write attempt's correction

Every write attempt stages into a directory of its own (``stage_id``) inside the table's
directory; the ledger's manifest names the one attempt whose files are the batch, and the
append commits exactly those files to the Delta log as they are (``add`` actions with their
statistics: no row is read or rewritten). Staged files of a batch that can never be committed
are deleted by the sink (:func:`reconcile.sink.sync.gc_staged`); Delta's VACUUM removes any
orphan after the retention period, as it does for any file the log does not name.

Every Delta commit the sink makes carries ``userMetadata = {"reconcile": {...}}`` naming the
operation and, for a batch, its ``batch_id``, ``lower`` and ``upper``. Batch commits also record
the application transaction ``(appId = reconcile-sink:<sink>, version = lower)``: a batch is
committed only if the last version recorded for that app id is below its ``lower``, and only at
the version after the one whose snapshot was checked (put-if-absent of the commit file), so a
batch, or any batch with an older ``lower``, can never be committed twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from datetime import UTC, date, datetime, timedelta
from typing import Any
from urllib.parse import unquote

from reconcile import settings
from reconcile.config import SinkConfig
from reconcile.errors import Retryable, ShardSchemaChanged, SinkError, brief
from reconcile.log import iso
from reconcile.model import CommitRecord

log = logging.getLogger("reconcile.shard")
META_KEY = "reconcile"
MAINTENANCE = "maintenance"
BATCHES_DIR = "batches"
PART_COLUMN = "reconcile_part"  # the staged files' hash-partition directory: reconcile_part=<p>/


def table_path(cfg: SinkConfig) -> str:
    return f"{settings.warehouse()}/{cfg.name}"


def staging_root(cfg: SinkConfig) -> str:
    return f"{table_path(cfg)}/{BATCHES_DIR}"


def staging_path(cfg: SinkConfig, batch_id: str, stage_id: str | None = None) -> str:
    """The batch's staging directory, or one write attempt's directory inside it."""
    path = f"{staging_root(cfg)}/{batch_id}"
    return f"{path}/{stage_id}" if stage_id else path


def legacy_staging_root(cfg: SinkConfig) -> str:
    """Where releases before the metadata-only append staged (outside the table)."""
    return f"{settings.warehouse()}/_staging/{cfg.name}"


def table_relative(cfg: SinkConfig, batch_id: str, stage_id: str, rel: str) -> str:
    """A staged file's path relative to the table, as its Delta ``add`` action names it."""
    return f"{BATCHES_DIR}/{batch_id}/{stage_id}/{rel}"


def new_stage_id() -> str:
    return f"w-{uuid.uuid4().hex[:16]}"


def app_id(cfg: SinkConfig) -> str:
    return f"reconcile-sink:{cfg.name}"


# -- files (fsspec: local folders and object stores alike) ------------------------------------


def _fs(path: str):
    from fsspec.core import url_to_fs

    return url_to_fs(path)


def read_text(path: str) -> str | None:
    """A small file's text (None if it does not exist)."""
    fs, p = _fs(path)
    try:
        with fs.open(p, "rb") as f:
            return f.read().decode("utf-8")
    except FileNotFoundError:
        return None


def read_bytes(path: str) -> bytes:
    fs, p = _fs(path)
    with fs.open(p, "rb") as f:
        return f.read()


def digest(path: str) -> str:
    """A file's content digest (sha256, hex)."""
    return hashlib.sha256(read_bytes(path)).hexdigest()


def list_files(path: str) -> dict[str, int]:
    """{relative path: size} of the data files below ``path`` (empty if it does not exist).

    A directory deleted while it is listed (another attempt's cleanup) is listed again; one
    that is gone is empty."""
    fs, root = _fs(path)
    root = root.rstrip("/")
    for attempt in range(3):
        try:
            if not fs.exists(root):
                return {}
            found = fs.find(root, detail=True)
        except FileNotFoundError:
            if attempt == 2:
                raise
            continue
        out = {}
        for full, info in found.items():
            rel = full[len(root) + 1 :] if full.startswith(root + "/") else full
            if rel.rsplit("/", 1)[-1].startswith(("_", ".")) or info.get("type") == "directory":
                continue
            out[rel] = int(info["size"])
        return out
    return {}


def list_dirs(path: str) -> list[str]:
    fs, root = _fs(path)
    try:
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False) if fs.isdir(p))
    except FileNotFoundError:
        return []


def path_exists(path: str) -> bool:
    fs, p = _fs(path)
    return bool(fs.exists(p))


def delete_path(path: str, attempts: int = 3) -> bool:
    """Delete a staged directory; False if it was not there or could not be emptied. Cleanup is
    best effort and never fails a task: an outdated attempt may still be writing files into the
    directory while it is removed (the listing is then not empty); what stays is deleted by the
    next cleanup."""
    fs, p = _fs(path)
    for attempt in range(attempts):
        try:
            if not fs.exists(p):
                return False
            fs.rm(p, recursive=True)
            return True
        except FileNotFoundError:  # deleted meanwhile by another attempt's cleanup
            return False
        except OSError as exc:  # ENOTEMPTY: a zombie attempt wrote into it meanwhile
            if attempt == attempts - 1:
                log.warning("could not delete %s (%s): the next cleanup retries it", path, exc)
                return False
            time.sleep(0.2 * (attempt + 1))
    return False


# -- the Delta log --------------------------------------------------------------------------


def _log_path(cfg: SinkConfig) -> str:
    return f"{table_path(cfg)}/_delta_log"


def log_versions(cfg: SinkConfig) -> list[int]:
    """The versions whose commit files are in the Delta log, ascending (one listing; a commit
    file appears atomically, so the highest name is the latest version)."""
    fs, p = _fs(_log_path(cfg))
    try:
        names = [n.rsplit("/", 1)[-1] for n in fs.ls(p, detail=False)]
    except FileNotFoundError:
        return []
    return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())


def exists(cfg: SinkConfig) -> bool:
    return bool(log_versions(cfg))


def _committed_versions(cfg: SinkConfig) -> list[int]:
    versions = log_versions(cfg)
    if not versions:
        raise Retryable(f"the Delta table at {table_path(cfg)} has no commits", sink=cfg.name)
    return versions


def latest_version(cfg: SinkConfig) -> int:
    return _committed_versions(cfg)[-1]


def commit_actions(cfg: SinkConfig, version: int) -> list[dict]:
    """The actions of one Delta version, read from its commit file (one JSON object per line)."""
    text = read_text(f"{_log_path(cfg)}/{version:020d}.json")
    if text is None:  # listed a moment ago: removed by Delta's log cleanup meanwhile
        raise Retryable(f"Delta commit file of version {version} under {_log_path(cfg)} is gone", sink=cfg.name)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _info_of(actions: list[dict]) -> dict:
    return next((a["commitInfo"] for a in actions if "commitInfo" in a), {})


def _guard_txn(cfg: SinkConfig, actions: list[dict]) -> int | None:
    """The ``txnVersion`` a version's actions record for the sink's commit guard, if any."""
    return next((int(a["txn"]["version"]) for a in actions if a.get("txn", {}).get("appId") == app_id(cfg)), None)


def commit_info(cfg: SinkConfig, version: int) -> dict:
    """The ``commitInfo`` action of one Delta version."""
    return _info_of(commit_actions(cfg, version))


def _snapshot(cfg: SinkConfig, version: int | None = None):
    from deltalake import DeltaTable

    return DeltaTable(table_path(cfg), version=version)


_DELTA_TYPES = {"tinyint": "byte", "smallint": "short", "int": "integer", "bigint": "long"}


def _delta_type(spark_type: str) -> str:
    t = spark_type.lower().replace(" ", "")
    return _DELTA_TYPES.get(t, t)


def _table_schema(cfg: SinkConfig) -> str:
    """The shard's Delta schema (JSON): the sink's columns, then ``_time``, ``_diff``, ``_error``.
    Every column is nullable in the table (error rows null them), whatever the sink declares."""
    cols = [(c.name, _delta_type(c.type)) for c in cfg.columns]
    cols += [("_time", "long"), ("_diff", "long"), ("_error", "string")]
    fields = [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in cols]
    return json.dumps({"type": "struct", "fields": fields})


def ensure_table(cfg: SinkConfig) -> None:
    """Create the shard's Delta table if missing (delta-rs: no JVM); refuse one whose schema
    drifted. Version 0 is one metadata-only commit, atomic by the put-if-absent of the first
    commit file: a concurrent creator loses that race with an error and then finds the table.
    It changes no data (a "maintenance" commit to :func:`describe_commit`)."""
    from deltalake import DeltaTable, Schema

    attempt = 0
    while not exists(cfg):
        attempt += 1
        try:
            DeltaTable.create(
                table_path(cfg),
                schema=Schema.from_json(_table_schema(cfg)),
                mode="error",
                name=cfg.name,
                # Spark's default; delta-rs would assume 100
                configuration={"delta.checkpointInterval": "10"},
            )
        except Exception as exc:
            if exists(cfg):
                break
            if attempt >= 5:
                raise Retryable(
                    f"cannot create the shard's Delta table at {table_path(cfg)}: {brief(exc, 300)}.",
                    sink=cfg.name,
                    remedy="the task retries by itself; if it persists, check the warehouse path.",
                ) from None
            time.sleep(0.5 * attempt)
    check_schema(cfg)


def check_schema(cfg: SinkConfig) -> None:
    """Refuse a Delta table whose columns are not the sink's (changed behind its back)."""
    fields = json.loads(_snapshot(cfg).schema().to_json())["fields"]
    have = [(f["name"].lower(), f["type"] if isinstance(f["type"], str) else json.dumps(f["type"])) for f in fields]
    want = [(c.name.lower(), _delta_type(c.type)) for c in cfg.columns]
    want += [("_time", "long"), ("_diff", "long"), ("_error", "string")]
    if want != have:
        raise ShardSchemaChanged(
            f"Delta table {table_path(cfg)} has columns {have}, the sink expects {want}", sink=cfg.name
        )


def _data_files(dt) -> list[str]:
    """The data files a delta-rs snapshot names, relative to the table, decoded."""
    return [unquote(a) for a in dt.get_add_actions(flatten=True).column("path").to_pylist()]


def snapshot_files(cfg: SinkConfig) -> list[str]:
    """The data files the table's latest snapshot names, relative to the table, decoded."""
    return _data_files(_snapshot(cfg))


# Reader features that leave every data file readable as it is, by name (Spark reads timestamp_ntz
# columns from Parquet itself).
_PLAIN_READER_FEATURES = {"timestampNtz"}
# Characters a Hadoop path would take for a glob or a URI part.
_NOT_PLAIN = set("*?[]{}\\:")


def plain_files(cfg: SinkConfig, version: int | None = None) -> list[str] | None:
    """The data files of the table at ``version`` (latest: None), as paths Spark reads as plain
    Parquet: one log replay in this process (delta-rs), no Spark job. None when the table must
    be read through Delta's own reader: deletion vectors, column mapping or any other reader
    feature; a file name Spark would take for a glob."""
    dt = _snapshot(cfg, version)
    protocol = dt.protocol()
    plain = protocol.min_reader_version == 1 or (  # 2: column mapping, without a feature list
        protocol.min_reader_version == 3 and set(protocol.reader_features or ()) <= _PLAIN_READER_FEATURES
    )
    if not plain:
        return None
    names = _data_files(dt)
    if any(_NOT_PLAIN & set(n) or "://" in n or n.startswith("/") for n in names):
        return None
    return [f"{table_path(cfg)}/{n}" for n in names]


def last_txn_version(cfg: SinkConfig, as_of: int | None = None) -> int | None:
    """The last version the sink's commit guard recorded (application transaction of its app
    id) in the table's snapshot at Delta version ``as_of`` (default: the latest)."""
    return _snapshot(cfg, as_of).transaction_version(app_id(cfg))


def reconcile_meta(info: dict) -> dict | None:
    """The sink's own commit metadata (``userMetadata["reconcile"]``), None for foreign commits."""
    try:
        meta = json.loads(info.get("userMetadata") or "").get(META_KEY)
    except (ValueError, AttributeError):
        return None
    return meta if isinstance(meta, dict) else None


def describe_commit(actions: list[dict]) -> dict | None:
    """What the sink makes of one Delta version: its own commit metadata; for a foreign commit
    that changes no data (``VACUUM START``/``END``, ``OPTIMIZE``, table properties: no
    ``add``/``remove`` with ``dataChange``) ``{"op": "maintenance", ...}``; None for a foreign
    commit that changes data (drift the next batch repairs and measures)."""
    info = _info_of(actions)
    meta = reconcile_meta(info)
    if meta is not None:
        return meta
    changes = [a.get("add") or a.get("remove") or {} for a in actions if "add" in a or "remove" in a]
    if any(c.get("dataChange", True) for c in changes):
        return None
    return {"op": MAINTENANCE, "operation": info.get("operation")}


def version_description(cfg: SinkConfig, version: int) -> tuple[bool, dict | None]:
    """(whether the log holds the commit file of ``version``, its :func:`describe_commit`):
    one small read, to tell whether a version is still the commit the ledger recorded."""
    text = read_text(f"{_log_path(cfg)}/{version:020d}.json")
    if text is None:
        return False, None
    return True, describe_commit([json.loads(line) for line in text.splitlines() if line.strip()])


def log_entries(cfg: SinkConfig, after: int) -> tuple[int, list[tuple[int, dict | None, int | None]]]:
    """(latest version, [(version, :func:`describe_commit`, the ``txnVersion`` the version
    records for the sink's commit guard or None)] for versions > after, ascending)."""
    versions = _committed_versions(cfg)
    entries = []
    for v in versions:
        if v > after:
            actions = commit_actions(cfg, v)
            entries.append((v, describe_commit(actions), _guard_txn(cfg, actions)))
    return versions[-1], entries


def history_since(cfg: SinkConfig, after: int) -> tuple[int, list[tuple[int, dict | None]]]:
    """(latest version, [(version, :func:`describe_commit`)] for versions > after, ascending)."""
    latest, entries = log_entries(cfg, after)
    return latest, [(v, meta) for v, meta, _ in entries]


def batch_commits(entries: list[tuple[int, dict | None]]) -> list[CommitRecord]:
    return [
        CommitRecord(
            version=v,
            batch_id=m["batch_id"],
            lower=int(m["lower"]),
            upper=int(m["upper"]),
            run_id=m.get("run_id"),
            rows_ok=m.get("rows_ok"),
            rows_err=m.get("rows_err"),
            source_offset=m.get("source_offset"),
            late_commands=m.get("late_commands"),
            stage_id=m.get("stage_id"),
        )
        for v, m in entries
        if m and m.get("op") == "batch"
    ]


def added_files(actions: list[dict]) -> list[dict]:
    """The ``add`` actions of a Delta version, paths relative to the table and decoded."""
    return [{**a["add"], "path": unquote(a["add"]["path"])} for a in actions if "add" in a]


def part_of(path: str) -> int | None:
    """The hash partition a staged file belongs to (its ``reconcile_part=<p>`` directory)."""
    for seg in path.split("/"):
        if seg.startswith(PART_COLUMN + "="):
            return int(seg.split("=", 1)[1])
    return None


# -- the metadata-only batch commit -----------------------------------------------------------

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

    fs, p = _fs(path)
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


class CommitRejected(SinkError):
    """The Delta table refuses the commit for a reason retrying cannot change (its protocol)."""


def commit_files(cfg: SinkConfig, files: list[tuple[str, int, dict]], meta: dict, lower: int) -> int | None:
    """Commit ``files`` (``(path relative to the table, size, stats)``) as one Delta version
    whose commit metadata is ``meta`` and whose application transaction is ``lower``: only if the
    snapshot's last recorded transaction is below ``lower``, at exactly the version after that
    snapshot (put-if-absent; a concurrent commit makes this re-check on the newer snapshot).

    Returns the new version, or None when the guard skipped the commit (a version at or above
    ``lower`` is recorded: someone committed this lower, or a later one)."""
    from deltalake import CommitProperties, Transaction
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import AddAction

    now_ms = int(time.time() * 1000)
    actions = [
        AddAction(
            path=path,
            size=size,
            partition_values={},
            modification_time=now_ms,
            data_change=True,
            stats=json.dumps(stats, separators=(",", ":")),
        )
        for path, size, stats in files
    ]
    user_meta = json.dumps({META_KEY: {"op": "batch", "sink": cfg.name, **meta}}, sort_keys=True)
    for attempt in range(20):
        dt = _snapshot(cfg)
        recorded = dt.transaction_version(app_id(cfg))
        if recorded is not None and recorded >= lower:
            return None
        read = dt.version()
        props = CommitProperties(
            custom_metadata={"userMetadata": user_meta},
            max_commit_retries=0,
            app_transactions=[Transaction(app_id=app_id(cfg), version=lower, last_updated=now_ms)],
        )
        try:
            dt.create_write_transaction(actions, mode="append", schema=dt.schema(), commit_properties=props)
        except CommitFailedError:  # another version took read + 1: check again on the newer snapshot
            time.sleep(min(0.05 * (attempt + 1), 0.5))
            continue
        except Exception as exc:  # noqa: BLE001 - the table's protocol or storage refuses the writer
            raise CommitRejected(
                f"the Delta table at {table_path(cfg)} refused the batch commit: {brief(exc, 300)}",
                sink=cfg.name,
                remedy="check the table's protocol/features (`DESCRIBE DETAIL`) and the warehouse's permissions; "
                "nothing was committed, clear 'append' once fixed.",
            ) from None
        return read + 1
    raise Retryable(
        f"Delta commit of the batch with lower {iso(lower)} kept losing to concurrent commits",
        sink=cfg.name,
        remedy="the task retries by itself; nothing was committed.",
    )
