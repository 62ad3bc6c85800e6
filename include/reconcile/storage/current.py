"""A sink's current-state table, without a JVM: a plain Delta table of the sink's columns (no
``_time``, ``_diff``, ``_error``) holding the shard's collection as of its latest version, one row
per unit of count. Its files are written with pyarrow and committed by delta-rs the one way the
sink commits (:func:`reconcile.storage.delta.commit_next`: put-if-absent of the version after
the snapshot read, under the shard's commit lease). Each commit records, as its application
transaction ``(reconcile-current:<sink>, v)``, the shard's Delta version ``v`` it reflects.
:mod:`reconcile.sink.current` decides what to write.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from reconcile import settings
from reconcile.config import SinkConfig
from reconcile.errors import Retryable, brief
from reconcile.storage import files, footers
from reconcile.storage.commits import META_KEY, describe_commit, info_of, parse_actions, reconcile_meta
from reconcile.storage.deletion_vectors import file_name
from reconcile.storage.delta import commit_next, delta_type, log_versions

CURRENT_OP = "current"
ROWS_PER_FILE = 1_000_000
DV_FEATURE = "deletionVectors"


def current_path(cfg: SinkConfig, warehouse: str | None = None) -> str:
    """Where the sink's current-state table lives: its ``current.path``, else beside the shard
    (``<warehouse>/<sink>.current``: no sink name has a dot, so no shard is ever there)."""
    if cfg.current is not None and cfg.current.path:
        return cfg.current.path
    return f"{warehouse or settings.warehouse()}/{cfg.name}.current"


class CurrentTable:
    """The current-state Delta table of one sink (``cfg.current`` set)."""

    def __init__(self, cfg: SinkConfig, warehouse: str | None = None):
        self.cfg = cfg
        self.name = cfg.name
        self.path = current_path(cfg, warehouse)
        self.log_path = f"{self.path}/_delta_log"
        self.app_id = f"reconcile-current:{cfg.name}"
        self.storage_options = settings.delta_storage_options()

    def __repr__(self) -> str:
        return f"CurrentTable({self.path!r})"

    def schema_json(self) -> str:
        fields = [
            {"name": c.name, "type": delta_type(c.type), "nullable": True, "metadata": {}} for c in self.cfg.columns
        ]
        return json.dumps({"type": "struct", "fields": fields})

    def arrow_schema(self):
        import pyarrow as pa
        from deltalake import Schema

        return pa.schema(Schema.from_json(self.schema_json()).to_arrow())

    def exists(self) -> bool:
        return bool(log_versions(self.log_path))

    def snapshot(self):
        from deltalake import DeltaTable

        return DeltaTable(self.path, storage_options=self.storage_options)

    def create(self) -> None:
        """The empty table (a metadata-only version 0; a concurrent creator loses with an error
        and then finds the table)."""
        from deltalake import DeltaTable, Schema

        try:
            DeltaTable.create(
                self.path,
                schema=Schema.from_json(self.schema_json()),
                mode="error",
                name=self.name,
                description=f"current state of sink {self.name} (maintained by the sink; do not write)",
                storage_options=self.storage_options,
                configuration={
                    "delta.checkpointInterval": "10",
                    **({"delta.enableDeletionVectors": "true"} if self.wants_vectors() else {}),
                },
            )
        except Exception as exc:  # noqa: BLE001 - lost the race to another creator, or storage refused
            if not self.exists():
                raise Retryable(
                    f"cannot create the current-state table at {self.path}: {brief(exc, 300)}",
                    sink=self.name,
                    remedy="the task retries by itself; if it persists, check the path's permissions.",
                ) from None

    def wants_vectors(self) -> bool:
        """Is the table to be created with deletion vectors (``current.deletion_vectors``, and a
        store where the sink commits them: a local disk or S3)?"""
        spec = self.cfg.current
        return bool(spec is not None and spec.deletion_vectors) and settings.store_of(self.path) in (None, "s3")

    def has_vectors(self, dt) -> bool:
        """Does the table's protocol have deletion vectors (retractions mark rows, not rewrite)?"""
        return DV_FEATURE in (dt.protocol().reader_features or [])

    def own_meta(self, dt) -> dict:
        """The sink's metadata of the snapshot's own version (empty when another writer made it)."""
        text = files.read_text(f"{self.log_path}/{dt.version():020d}.json")
        return (reconcile_meta(info_of(parse_actions(text))) or {}) if text else {}

    def vectors(self, dt) -> dict[str, dict]:
        """The deletion vector descriptor of each data file that has one (path relative to the
        table), as the sink's last commit recorded it (every commit records them all)."""
        return dict(self.own_meta(dt).get("vectors") or {})

    def reflected(self, dt) -> int | None:
        """The shard version the snapshot ``dt`` reflects (its last application transaction)."""
        return dt.transaction_version(self.app_id)

    def foreign_versions(self, dt) -> list[int]:
        """The versions of ``dt``'s log after the sink's last commit to it that another writer
        made and that changed data (they are undone by the next maintenance: a rebuild)."""
        versions = log_versions(self.log_path)
        foreign: list[int] = []
        for v in reversed([v for v in versions if v <= dt.version()]):
            text = files.read_text(f"{self.log_path}/{v:020d}.json")
            if text is None:
                break
            actions = parse_actions(text)
            if (reconcile_meta(info_of(actions)) or {}).get("op") == CURRENT_OP:
                break
            if describe_commit(actions) is None:
                foreign.append(v)
        return sorted(foreign)

    def data_files(self, dt) -> list[tuple[str, int]]:
        """(path relative to the table, size) of every file of the snapshot."""
        return [(p, size) for p, size, _ in self.files_and_rows(dt)]

    def files_and_rows(self, dt) -> list[tuple[str, int, int]]:
        """(path relative to the table, size, rows stored in it) of every file of the snapshot."""
        from urllib.parse import unquote

        import pyarrow as pa

        adds = pa.table(dt.get_add_actions(flatten=True))
        paths = [unquote(p) for p in adds.column("path").to_pylist()]
        rows = [int(n or 0) for n in adds.column("num_records").to_pylist()]
        return list(zip(paths, adds.column("size_bytes").to_pylist(), rows, strict=True))

    def write_rows(self, table) -> list[tuple[str, int, dict]]:
        """Write ``table`` (the sink's columns) as new Parquet files of at most
        :data:`ROWS_PER_FILE` rows; returns (path relative to the table, size, Delta stats)."""
        import pyarrow.parquet as pq

        table = table.select(self.cfg.column_names).cast(self.arrow_schema())
        fs, root = files.fs_of(self.path)
        out = []
        for start in range(0, table.num_rows, ROWS_PER_FILE):
            rel = f"part-{uuid.uuid4().hex}.snappy.parquet"
            with fs.open(f"{root}/{rel}", "wb") as f:
                pq.write_table(table.slice(start, ROWS_PER_FILE), f, compression="snappy")
            full = f"{self.path}/{rel}"
            out.append((rel, fs.size(f"{root}/{rel}"), footers.file_stats(full)))
        return out

    def commit(
        self,
        dt,
        mode: str,
        added: list[tuple[str, int, dict]],
        removed: list[tuple[str, int]],
        meta: dict[str, Any],
        shard_version: int,
    ) -> int | None:
        """One commit at the version after ``dt``'s (None: another commit took it)."""
        return commit_next(
            dt,
            self.path,
            self.name,
            self.app_id,
            mode,
            added,
            {"op": CURRENT_OP, "shard_version": shard_version, **meta},
            shard_version,
            "current",
            removed=removed,
        )

    def commit_vectors(
        self,
        dt,
        added: list[tuple[str, int, dict]],
        marked: dict[str, tuple[int, dict, dict]],
        removed: list[tuple[str, int]],
        before: dict[str, dict],
        vectors: dict[str, dict],
        meta: dict[str, Any],
        shard_version: int,
    ) -> int | None:
        """One commit at the version after ``dt``'s that delta-rs cannot make: ``marked`` (path ->
        size, stats, new deletion vector descriptor) re-added with their new vectors, ``removed``
        gone, ``added`` new; ``vectors`` (every file's descriptor after it) recorded in the
        sink's metadata. Each file's old logical entry (path and old vector, ``before``: what
        :meth:`vectors` said of ``dt``) is removed, as the protocol keys a file by both. Written put-if-absent
        (None: another commit took the version); a checkpoint every 10 versions, as delta-rs."""
        from urllib.parse import quote

        now = now_ms()
        version = dt.version() + 1
        user = json.dumps(
            {
                META_KEY: {
                    "sink": self.name,
                    "op": CURRENT_OP,
                    "shard_version": shard_version,
                    **meta,
                    "vectors": vectors,
                }
            },
            sort_keys=True,
        )
        actions: list[dict] = [
            {
                "commitInfo": {
                    "timestamp": now,
                    "operation": "DELETE",
                    "operationParameters": {"predicate": '["retracted by the shard"]'},
                    "userMetadata": user,
                    "engineInfo": "reconcile",
                    "isBlindAppend": False,
                }
            },
            {"txn": {"appId": self.app_id, "version": shard_version, "lastUpdated": now}},
        ]
        for path, size in [(p, s) for p, (s, _, _) in marked.items()] + list(removed):
            remove = {"path": quote(path), "dataChange": True, "deletionTimestamp": now, "extendedFileMetadata": True}
            remove.update(partitionValues={}, size=size, **({"deletionVector": before[path]} if path in before else {}))
            actions.append({"remove": remove})
        for path, (size, stats, dv) in marked.items():
            actions.append({"add": _add(path, size, {**stats, "tightBounds": False}, now, dv)})
        actions += [{"add": _add(p, size, stats, now, None)} for p, size, stats in added]
        body = "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions)
        if not files.put_if_absent(f"{self.log_path}/{version:020d}.json", body.encode()):
            return None
        if version % 10 == 0:
            try:
                self.snapshot().create_checkpoint()
            except Exception as exc:  # noqa: BLE001 - a checkpoint only speeds reads up; the next one comes
                import logging

                logging.getLogger(__name__).warning("no checkpoint at version %s of %s: %s", version, self.path, exc)
        return version

    def vacuum(self, retention_hours: int) -> list[str]:
        """Delete the files the latest snapshot does not name (removed by the log, or written by
        an attempt that died before its commit) last changed more than ``retention_hours`` ago;
        nothing is committed. Returns them, relative to the table."""
        from urllib.parse import unquote

        if not self.exists():
            return []
        dt = self.snapshot()
        listed = dt.vacuum(retention_hours=retention_hours, enforce_retention_duration=False, dry_run=True, full=True)
        # delta-rs's vacuum counts no deletion vector file as named: keep the ones the snapshot
        # reads (every one while another writer's commit may name some)
        keep = {file_name(d) for d in self.vectors(dt).values()}
        foreign = bool(self.foreign_versions(dt))
        deleted = sorted(
            p
            for p in (unquote(x) for x in listed)
            if not (p.startswith("deletion_vector_") or "/deletion_vector_" in p) or (p not in keep and not foreign)
        )
        files.delete_files([f"{self.path}/{p}" for p in deleted])
        return deleted


def read_parquet(paths: list[str], columns: list[str] | None = None, *, positions: bool = False):
    """The rows of Parquet files (local or on an object store), concatenated, with ``_file``: the
    index of each row's file in ``paths`` (``positions``: and ``_pos``, the row's position in its
    file, as deletion vectors count). Read in parallel (a round trip each on a store)."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa
    import pyarrow.parquet as pq

    def read(item: tuple[int, str]):
        i, path = item
        fs, p = files.fs_of(path)
        with fs.open(p, "rb") as f:
            t = pq.read_table(f, columns=columns)
        t = t.append_column("_file", pa.array([i] * t.num_rows, pa.int32()))
        return t.append_column("_pos", pa.array(range(t.num_rows), pa.int64())) if positions else t

    if not paths:
        return None
    with ThreadPoolExecutor(max_workers=min(8, len(paths))) as pool:
        tables = list(pool.map(read, enumerate(paths)))
    return pa.concat_tables(tables, promote_options="permissive")


def _add(path: str, size: int, stats: dict, now: int, dv: dict | None) -> dict:
    from urllib.parse import quote

    add = {"path": quote(path), "partitionValues": {}, "size": size, "modificationTime": now, "dataChange": True}
    add["stats"] = json.dumps(stats, separators=(",", ":"))
    return {**add, "deletionVector": dv} if dv else add


def now_ms() -> int:
    return int(time.time() * 1000)
